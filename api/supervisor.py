"""One host: run the stack's processes, restart the one that dies, stop them all together.

`Supervisor` owns every process `sealed up` starts. Each child runs in its own session (a terminal's
SIGINT or SIGHUP reaches only the supervisor, which then stops the children in order) and is asked
by the kernel to stop if the supervisor itself dies (`PR_SET_PDEATHSIG`), so nothing is left behind
even after `kill -9` of `sealed up`. A child that exits while the stack runs is started again with
the same arguments (same ports: workers keep their broker and gateway addresses) after a backoff
that doubles on each quick failure (0.5 s up to 10 s) and resets once the child has run for 30 s.
A child may also be given a health check, asked every `HEALTH_EVERY_S` while it runs: a reason
it gives means it is up but cannot recover in place (a worker whose key lease ran out wiped its
model), so the supervisor stops it (SIGTERM, SIGKILL after `STOP_GRACE_S`) and it is restarted like a
child that exited, with the same backoff.
A child that exits with `EXIT_CONFIG_ERROR` (protocol/exit_codes.py: it cannot run as configured,
e.g. the worker's compiled CPU kernels are missing or stale) is not restarted: the supervisor keeps
that as `failure` (a `ChildFailed` with the child's last log line), and `sealed up` stops the stack
and shows it.

`RunLock` is the pid file `$SEALED_HOME/run/sealed.pid`, held with `flock` for the supervisor's
life: a second `sealed up` on the same home is refused with one line, and a stale file left by a
killed supervisor does not block (the kernel drops the lock with the process).
"""

from __future__ import annotations

import ctypes
import fcntl
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from api.errors import SealedApiError
from protocol.exit_codes import EXIT_CONFIG_ERROR

log = logging.getLogger(__name__)

PR_SET_PDEATHSIG = 1
BACKOFF_FIRST_S = 0.5
BACKOFF_MAX_S = 10.0
STABLE_AFTER_S = 30.0
HEALTH_EVERY_S = 5.0
STOP_GRACE_S = 10.0


class AlreadyRunning(SealedApiError, RuntimeError):
    """Another supervisor holds this home's run lock."""

    def __init__(self, pid_file: Path, pid: str) -> None:
        super().__init__(f"a Sealed stack is already running on this home (pid {pid or '?'}, pid file {pid_file})")
        self.pid_file = pid_file


class RunLock:
    """The home's pid file, locked (flock) while this process supervises a stack."""

    def __init__(self, run_dir: Path) -> None:
        self.path = run_dir / "sealed.pid"
        run_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = os.pread(fd, 32, 0).decode(errors="replace").strip()
            os.close(fd)
            raise AlreadyRunning(self.path, pid) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd: int | None = fd

    def release(self) -> None:
        if self._fd is not None:
            os.ftruncate(self._fd, 0)
            os.close(self._fd)  # closing drops the flock
            self._fd = None


class ChildFailed(SealedApiError, RuntimeError):
    """A child exited with EXIT_CONFIG_ERROR: the stack cannot run until its configuration changes."""

    def __init__(self, name: str, code: int, last_line: str, log_path: Path) -> None:
        super().__init__(f"{name} cannot start: {last_line or '(no output)'} (exit {code}; restarting cannot help; "
                         f"log: {log_path})")
        self.name, self.code, self.last_line, self.log_path = name, code, last_line, log_path


def last_log_lines(path: Path, count: int, tail_bytes: int = 4096) -> str:
    """The last `count` non-empty lines of a child's log (the log is appended to across runs)."""
    try:
        with path.open("rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - tail_bytes))
            lines = f.read().decode(errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join([line.strip() for line in lines if line.strip()][-count:])


def last_log_line(path: Path, tail_bytes: int = 4096) -> str:
    """The last non-empty line of a child's log (its one-line reason)."""
    return last_log_lines(path, 1, tail_bytes)[:500]


def _die_with_parent() -> None:  # runs in the child between fork and exec
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


@dataclass
class Child:
    name: str
    args: list[str]  # `python -m` arguments
    log_dir: Path
    proc: subprocess.Popen | None = None
    started_at: float = 0.0
    restarts: int = 0
    quick_failures: int = 0
    restart_at: float | None = None  # set while waiting out a backoff
    on_restart: Callable[[Child], None] | None = None
    python: str = sys.executable  # the interpreter (a vLLM worker runs from vLLM's own virtualenv)
    # Asked while the child runs: why it must be started again though it has not exited, or None.
    health: Callable[[Child], str | None] | None = None
    health_at: float = 0.0  # the next time `health` is asked
    stopping_since: float | None = None  # set once the supervisor asked a sick child to stop

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    @property
    def log_path(self) -> Path:
        return self.log_dir / f"{self.name}.log"

    def failed(self) -> ChildFailed | None:
        """Why this child cannot run, if it exited with EXIT_CONFIG_ERROR (else None: running, or
        an exit that a restart may cure)."""
        proc = self.proc
        if proc is None or proc.poll() != EXIT_CONFIG_ERROR:
            return None
        return ChildFailed(self.name, EXIT_CONFIG_ERROR, last_log_line(self.log_path), self.log_path)

    def spawn(self) -> subprocess.Popen:
        out = open(self.log_path, "ab")  # noqa: SIM115 (the child's for its lifetime)
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        try:
            self.proc = subprocess.Popen([self.python, "-m", *self.args], stdout=out, stderr=subprocess.STDOUT,
                                         env=env, start_new_session=True, preexec_fn=_die_with_parent)
        finally:
            out.close()
        self.started_at = time.monotonic()
        self.restart_at = None
        self.health_at = self.started_at + HEALTH_EVERY_S
        self.stopping_since = None
        return self.proc

    def check_health(self, now: float) -> None:
        """Stop a running child whose health check gives a reason (the exit then restarts it)."""
        proc = self.proc
        if proc is None:
            return
        if self.stopping_since is not None:
            if now - self.stopping_since >= STOP_GRACE_S:
                proc.kill()
            return
        if self.health is None or now < self.health_at:
            return
        self.health_at = now + HEALTH_EVERY_S
        try:
            reason = self.health(self)
        except Exception as exc:  # a broken check must not take the supervisor down; it is not a verdict
            log.warning("%s health check failed (%s)", self.name, type(exc).__name__)
            return
        if reason:
            log.warning("%s (pid %s) is up but cannot serve (%s); stopping it to start it again",
                        self.name, proc.pid, reason)
            proc.terminate()
            self.stopping_since = now


@dataclass
class Supervisor:
    log_dir: Path
    children: dict[str, Child] = field(default_factory=dict)
    failure: ChildFailed | None = None  # the first child that exited with EXIT_CONFIG_ERROR (never restarted)
    _stopping: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _thread: threading.Thread | None = None

    def start(self, name: str, args: list[str], on_restart: Callable[[Child], None] | None = None,
              python: str | None = None, health: Callable[[Child], str | None] | None = None) -> Child:
        with self._lock:
            child = Child(name, list(args), self.log_dir, on_restart=on_restart, python=python or sys.executable,
                          health=health)
            child.spawn()
            self.children[name] = child
            return child

    def remove(self, name: str, timeout: float = 10.0) -> None:
        """Stop one child for good (a retired or scaled-in worker)."""
        with self._lock:
            child = self.children.pop(name, None)
        if child is not None:
            _terminate([child], timeout)

    def watch(self, interval: float = 0.2) -> None:
        """Restart children that exit, in a thread of this process (its life bounds the children's)."""
        self._thread = threading.Thread(target=self._run, args=(interval,), name="supervisor", daemon=True)
        self._thread.start()

    def _run(self, interval: float) -> None:
        while not self._stopping.wait(interval):
            self.check()

    def check(self) -> None:
        now = time.monotonic()
        with self._lock:
            for child in list(self.children.values()):
                if self._stopping.is_set():
                    return
                proc = child.proc
                if proc is None:
                    continue
                if proc.poll() is None:
                    child.check_health(now)
                    continue
                failed = child.failed()
                if failed is not None:
                    if self.failure is None:
                        log.error("%s", failed)
                        self.failure = failed
                    continue  # restarting cannot help
                if child.restart_at is None:
                    ran = now - child.started_at
                    child.quick_failures = 0 if ran >= STABLE_AFTER_S else child.quick_failures + 1
                    delay = min(BACKOFF_MAX_S, BACKOFF_FIRST_S * 2 ** max(0, child.quick_failures - 1))
                    child.restart_at = now + delay
                    log.warning("%s (pid %s) exited with %s after %.1f s; restarting in %.1f s",
                                child.name, proc.pid, proc.returncode, ran, delay)
                elif now >= child.restart_at:
                    child.spawn()
                    child.restarts += 1
                    log.warning("%s restarted (pid %s, restart %d)", child.name, child.pid, child.restarts)
                    if child.on_restart is not None:
                        child.on_restart(child)

    def failed(self) -> ChildFailed | None:
        """The first child that cannot run (exited with EXIT_CONFIG_ERROR), also before `check` saw it."""
        if self.failure is None:
            with self._lock:
                self.failure = next((f for c in self.children.values() if (f := c.failed()) is not None), None)
        return self.failure

    def running(self) -> bool:
        return not self._stopping.is_set()

    def stop(self, timeout: float = 10.0, order: list[str] | None = None) -> None:
        """Stop every child: `order` first (e.g. workers, then gateway), the rest after."""
        self._stopping.set()
        with self._lock:
            names = list(self.children)
            first = [n for n in (order or []) if n in self.children]
            ordered = [self.children[n] for n in first + [n for n in reversed(names) if n not in first]]
        _terminate(ordered, timeout)


def _terminate(children: list[Child], timeout: float) -> None:
    procs = [c.proc for c in children if c.proc is not None]
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for proc in procs:
        try:
            proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
