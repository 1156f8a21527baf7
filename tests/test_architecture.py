"""The package import rules (pyproject.toml [tool.importlinter]) hold, so `make test` fails on a
violation. docs/architecture.md draws the same rules."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# In a child process: import-linter's CLI reconfigures logging (disabling loggers that exist), which
# would silence other tests' log capture in this session.
LINT = ("import sys; from importlinter.cli import lint_imports; "
        "sys.exit(lint_imports(config_filename=sys.argv[1], no_cache=True, no_logo=True))")


def test_import_contracts_hold() -> None:
    run = subprocess.run([sys.executable, "-c", LINT, str(ROOT / "pyproject.toml")], cwd=ROOT,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    assert " 0 broken" in run.stdout, run.stdout
