"""The CLI loads only what a command needs: verifying evidence or an audit log imports no torch and
no SQLAlchemy (they cost seconds and are not needed to read evidence)."""

from __future__ import annotations

import subprocess
import sys

import pytest

HEAVY = ("torch", "sqlalchemy")


def imported_modules(*argv: str) -> set[str]:
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "api.cli.main", *argv],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-2000:]
    return {line.rsplit("|", 1)[1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}


@pytest.mark.parametrize("argv", [("attest", "verify", "--help"), ("audit", "verify", "--help"), ("--help",)])
def test_light_commands_import_no_torch_and_no_sqlalchemy(argv: tuple[str, ...]) -> None:
    modules = imported_modules(*argv)
    assert "api.cli.main" in modules or "api.cli.lazy" in modules  # the probe sees the CLI's own imports
    assert not {m for m in modules if m.split(".")[0] in HEAVY}


def test_a_command_that_needs_the_engine_still_loads_it() -> None:
    # The probe can fail: `encrypt` needs the checkpoint loader, so torch must show up there.
    assert "torch" in imported_modules("encrypt", "--help")
