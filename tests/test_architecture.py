"""The package import rules (pyproject.toml [tool.importlinter]) hold, so `make test` fails on a
violation. docs/architecture.md draws the same rules."""

from __future__ import annotations

from pathlib import Path

import pytest
from importlinter import cli

ROOT = Path(__file__).resolve().parent.parent


def test_import_contracts_hold(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(ROOT)
    rc = cli.lint_imports(config_filename=str(ROOT / "pyproject.toml"), no_cache=True, no_logo=True)
    out = capsys.readouterr().out
    assert rc == 0, out
    assert " 0 broken" in out, out
