"""A stack started by the tests stops when the test process dies, even by SIGKILL (no finaliser runs)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

PARENT = """
import subprocess, sys, time
from tests.api.conftest import stop_with_pytest
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], preexec_fn=stop_with_pytest)
print(child.pid, flush=True)
time.sleep(600)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}").exists() and "Z" not in Path(f"/proc/{pid}/stat").read_text().split()[2]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_stack_gets_sigterm_when_the_test_process_is_killed() -> None:
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True,
                              cwd=Path(__file__).resolve().parents[2])
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    assert _alive(child)
    parent.send_signal(signal.SIGKILL)  # as a CI timeout or `kill -9` ends a test run
    parent.wait(10)
    deadline = time.monotonic() + 10
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child)
