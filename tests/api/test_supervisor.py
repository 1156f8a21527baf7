"""The one-host supervisor: restarts with backoff, stops everything, one stack per home."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from api.supervisor import HEALTH_EVERY_S, AlreadyRunning, ChildFailed, RunLock, Supervisor

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


FAKE_WORKER = """import sys
print("starting ...", flush=True)
print("worker: the compiled CPU kernels are stale (rebuild them: make kernels)", file=sys.stderr, flush=True)
sys.exit(int(sys.argv[1]))
"""


@pytest.fixture()
def fake_worker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A module that prints one reason on stderr and exits with the code it is given."""
    (tmp_path / "mods").mkdir()
    (tmp_path / "mods" / "fake_worker_exit.py").write_text(FAKE_WORKER)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path / "mods"), os.environ.get("PYTHONPATH", "")]))
    return "fake_worker_exit"


def test_a_configuration_error_is_not_restarted_and_says_why(tmp_path: Path, fake_worker: str) -> None:
    from protocol.exit_codes import EXIT_CONFIG_ERROR

    sup = Supervisor(tmp_path)
    child = sup.start("worker", [fake_worker, str(EXIT_CONFIG_ERROR)])
    other = sup.start("gateway", SLEEPER)
    assert child.proc is not None and other.proc is not None
    try:
        child.proc.wait(60)
        for _ in range(3):  # as often as the watch thread would: never restarted, whatever the backoff
            sup.check()
        assert child.restarts == 0 and child.restart_at is None
        failure = sup.failed()
        assert isinstance(failure, ChildFailed) and failure is sup.failure
        assert failure.code == EXIT_CONFIG_ERROR and failure.name == "worker"
        assert failure.last_line == "worker: the compiled CPU kernels are stale (rebuild them: make kernels)"
        assert str(failure) == (f"worker cannot start: {failure.last_line} (exit 3; restarting cannot help; "
                                f"log: {tmp_path / 'worker.log'})")
        assert other.proc.poll() is None  # stopping the stack is the caller's (sealed up's) decision
    finally:
        sup.stop()


def test_another_exit_code_is_still_restarted(tmp_path: Path, fake_worker: str) -> None:
    sup = Supervisor(tmp_path)
    child = sup.start("worker", [fake_worker, "1"])
    assert child.proc is not None
    try:
        child.proc.wait(60)
        sup.check()
        assert child.restart_at is not None and sup.failed() is None
    finally:
        sup.stop()


def test_launch_stops_at_once_when_the_worker_cannot_start(tmp_path: Path, fake_worker: str) -> None:
    """`wait_http` (how launch waits for each process) raises the child's reason, not a timeout."""
    from api.stack_children import wait_http
    from protocol.exit_codes import EXIT_CONFIG_ERROR

    sup = Supervisor(tmp_path)
    child = sup.start("worker", [fake_worker, str(EXIT_CONFIG_ERROR)])
    try:
        with pytest.raises(ChildFailed, match="compiled CPU kernels are stale"):
            wait_http("http://127.0.0.1:9/never", child, timeout=600)
    finally:
        sup.stop()


def test_sealed_up_prints_the_reason_in_one_line_and_exits_non_zero(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    import api.cli.up as up_module
    from api.cli.main import build

    log = tmp_path / "logs" / "worker.log"
    failure = ChildFailed("worker", 3, "worker: the compiled CPU kernels are missing", log)

    def launch(*_: object, **__: object) -> None:
        raise failure

    monkeypatch.setattr(up_module, "prepare_demo", lambda *a, **k: None)
    monkeypatch.setattr(up_module, "launch", launch)
    result = CliRunner().invoke(build(), ["up", "--home", str(tmp_path / "home")])
    assert result.exit_code == 1
    assert result.stderr.strip().splitlines() == [f"sealed up: {failure}"]
    assert "Traceback" not in result.output
    # The home's run lock was released: the next `sealed up` is not refused.
    RunLock(tmp_path / "home" / "run").release()


def test_the_real_worker_on_stale_kernels_stops_the_stack_with_its_line(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The chain end to end: a copy of the worker whose kernel source changed after the build (a pull
    without a reinstall), supervised as `sealed up` does: its one line comes back as ChildFailed."""
    from tests.enclave_worker.engine import test_engine_cpu_kernels_install as kernels

    tree = kernels._copy_of_the_worker(tmp_path)
    kernels._break_stale(kernels._built_module(tree))
    for name, value in kernels._no_compiler_env(tmp_path, tree).items():
        monkeypatch.setenv(name, value)
    monkeypatch.chdir(tmp_path)  # `python -m` puts the working directory first: the copy, not this checkout
    sup = Supervisor(tmp_path)
    child = sup.start("worker", ["enclave_worker", "--broker-url", "http://127.0.0.1:9", "--package-dir",
                                 str(tmp_path), "--tenant", "acme", "--model", "m", "--version", "v1",
                                 "--grpc-port", "0", "--port", "0"])
    try:
        from api.stack_children import wait_http

        with pytest.raises(ChildFailed) as failed:
            wait_http("http://127.0.0.1:9/never", child, timeout=kernels.BOOT_TIMEOUT_S)
        assert failed.value.code == 3 and child.restarts == 0
        assert failed.value.last_line.startswith("worker: the CPU kernels are stale"), failed.value.last_line
    finally:
        sup.stop()


def test_a_child_whose_health_check_gives_a_reason_is_stopped_and_started_again(tmp_path: Path) -> None:
    """A worker whose key lease ran out is up but wiped: the supervisor stops it and the exit path
    starts it again. A child whose check says nothing, or whose check raises, is left alone."""
    sick: dict[str, str | None] = {"a": None}

    def health_a(_: object) -> str | None:
        return sick["a"]

    def broken(_: object) -> str | None:
        raise RuntimeError("the check itself failed")

    sup = Supervisor(tmp_path)
    a = sup.start("a", SLEEPER, health=health_a)
    b = sup.start("b", SLEEPER, health=broken)
    a_pid, b_pid = a.pid, b.pid
    try:
        a.health_at = b.health_at = 0.0  # due now: no waiting on the clock
        sup.check()
        assert a.proc.poll() is None and a.stopping_since is None  # healthy: untouched
        sick["a"] = "key lease ran out without a renewal"
        a.health_at = b.health_at = 0.0
        sup.check()
        assert a.stopping_since is not None
        a.proc.wait(30)
        sup.check()  # the exit: a restart is scheduled ...
        assert a.restart_at is not None
        a.restart_at = time.monotonic()
        sup.check()  # ... and made
        assert a.pid != a_pid and a.proc.poll() is None and a.restarts == 1 and a.stopping_since is None
        assert a.health_at == a.started_at + HEALTH_EVERY_S  # a new process gets time before it is asked
        assert b.pid == b_pid and b.proc.poll() is None and b.restarts == 0
    finally:
        sup.stop()


def test_a_sick_child_that_ignores_sigterm_is_killed_after_the_grace(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "mods").mkdir()
    (tmp_path / "mods" / "stubborn_child.py").write_text(
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); time.sleep(600)")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path / "mods"), os.environ.get("PYTHONPATH", "")]))
    sup = Supervisor(tmp_path)
    child = sup.start("w", ["stubborn_child"], health=lambda _: "key broker unreachable")
    try:
        _wait(lambda: "up" in child.log_path.read_text())
        child.health_at = 0.0
        sup.check()
        assert child.stopping_since is not None
        sup.check()
        assert child.proc.poll() is None  # SIGTERM ignored; still within the grace
        child.stopping_since -= 3600  # as if the grace had passed
        sup.check()
        child.proc.wait(30)
        assert child.proc.returncode == -signal.SIGKILL
    finally:
        sup.stop()
