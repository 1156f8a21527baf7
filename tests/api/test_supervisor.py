"""The one-host supervisor: restarts with backoff, stops everything, one stack per home."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from api.supervisor import AlreadyRunning, RunLock, Supervisor

SLEEPER = ["http.server", "0", "--bind", "127.0.0.1"]  # any long-running module


def _wait(predicate, timeout: float = 15.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError("condition not met in time")


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # A zombie still answers kill(0); it is gone for our purpose once reaped or marked Z.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    except OSError:
        return True


def test_a_killed_child_is_restarted_and_the_others_keep_running(tmp_path: Path) -> None:
    sup = Supervisor(tmp_path)
    a, b = sup.start("a", SLEEPER), sup.start("b", SLEEPER)
    b_pid, a_pid = b.pid, a.pid
    sup.watch(interval=0.05)
    try:
        os.kill(a_pid, signal.SIGKILL)
        _wait(lambda: a.pid != a_pid and a.proc.poll() is None)
        assert a.restarts == 1
        assert b.pid == b_pid and b.proc.poll() is None, "the other child must not be touched"
    finally:
        sup.stop()
    assert all(_gone(p) for p in (a.pid, b.pid, a_pid))


def test_quick_failures_back_off_and_a_stable_run_resets_the_backoff(tmp_path: Path) -> None:
    sup = Supervisor(tmp_path)
    child = sup.start("crashy", ["json.tool", "/nonexistent"])  # exits at once, every time
    def backoff() -> tuple[float, float]:
        """The delay check() chose, bracketed by the clock read before and after it: exact whatever
        the load (no wall-clock duration is asserted)."""
        _wait(lambda: child.proc.poll() is not None)
        before = time.monotonic()
        sup.check()
        after = time.monotonic()
        return child.restart_at - after, child.restart_at - before

    def chose(delay: float, bracket: tuple[float, float]) -> bool:
        return bracket[0] <= delay <= bracket[1]

    brackets = []
    for _ in range(3):
        brackets.append(backoff())
        child.restart_at = time.monotonic()  # skip the wait, keep the count
        sup.check()
    assert [chose(d, b) for d, b in zip((0.5, 1.0, 2.0), brackets, strict=True)] == [True] * 3, brackets
    child.started_at -= 60  # as if it had run for a minute before this exit
    assert chose(0.5, backoff())  # a stable run reset the backoff to the first step
    sup.stop()


def test_a_child_dies_with_its_supervisor_even_on_kill_9(tmp_path: Path) -> None:
    code = ("import sys, time; from pathlib import Path; from api.supervisor import Supervisor; "
            f"s = Supervisor(Path({str(tmp_path)!r})); c = s.start('x', {SLEEPER!r}); "
            "print(c.pid, flush=True); time.sleep(600)")
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    child_pid = int(parent.stdout.readline())
    assert not _gone(child_pid)
    parent.kill()
    parent.wait()
    _wait(lambda: _gone(child_pid))


def test_run_lock_refuses_a_second_holder_and_names_the_pid_file(tmp_path: Path) -> None:
    lock = RunLock(tmp_path / "run")
    with pytest.raises(AlreadyRunning) as err:
        RunLock(tmp_path / "run")
    assert str(tmp_path / "run" / "sealed.pid") in str(err.value)
    assert str(os.getpid()) in str(err.value)
    lock.release()
    RunLock(tmp_path / "run").release()  # free again


def test_a_stale_pid_file_from_a_killed_supervisor_does_not_block(tmp_path: Path) -> None:
    code = ("import time; from pathlib import Path; from api.supervisor import RunLock; "
            f"RunLock(Path({str(tmp_path / 'run')!r})); print('held', flush=True); time.sleep(600)")
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    with pytest.raises(AlreadyRunning):
        RunLock(tmp_path / "run")
    holder.kill()
    holder.wait()
    assert (tmp_path / "run" / "sealed.pid").read_text().strip() == str(holder.pid)  # stale, not locked
    RunLock(tmp_path / "run").release()
