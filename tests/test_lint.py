"""ruff passes on the whole tree (pyproject.toml [tool.ruff]), so `make test` (what CI runs) fails on
a lint error, as it does on a broken import contract (tests/test_architecture.py) or a type error
(tests/test_typecheck.py)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from ruff.__main__ import find_ruff_bin

ROOT = Path(__file__).resolve().parent.parent


def test_ruff_is_clean() -> None:
    run = subprocess.run([find_ruff_bin(), "check", "--no-cache", "."], cwd=ROOT, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]


def test_ruff_sees_a_lint_error(tmp_path: Path) -> None:
    # The probe can fail: the same command on a file with an unused import exits non-zero.
    (tmp_path / "bad.py").write_text("import os\n")
    run = subprocess.run([find_ruff_bin(), "check", "--no-cache", "--config", str(ROOT / "pyproject.toml"),
                          str(tmp_path / "bad.py")], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert run.returncode == 1 and "F401" in run.stdout, run.stdout + run.stderr
