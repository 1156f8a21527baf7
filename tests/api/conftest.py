"""A real stack, started exactly as `sealed up` starts it, shared by the end-to-end tests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from api.stack import DEMO_MODEL, free_port


@dataclass(frozen=True)
class RunningStack:
    url: str
    api_key: str
    home: Path
    tmpdir: Path
    proc: subprocess.Popen


def stop_with_pytest() -> None:
    """`preexec_fn` for a long-lived stack: the kernel sends it SIGTERM when the test process dies.

    `sealed up` stops its whole stack on SIGTERM, but a test run that is killed (a CI timeout, an
    interrupted run) never reaches the fixture's finaliser, and its stacks (gateway, worker, broker,
    about a tenth of a core each) kept running and skewed every benchmark after it. Called in the
    child between fork and exec; the stacks are started from pytest's main thread, which lives as
    long as the run (the signal follows the thread that forked)."""
    if sys.platform.startswith("linux"):
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


def start_sealed_up(root: Path, timeout: float = 420.0, ready_line: bool = False,
                    args: tuple[str, ...] = ()) -> RunningStack:
    """Start `sealed up`; return once /readyz says ready, or (`ready_line`) the moment it prints "Sealed is up"."""
    home, tmpdir = root / "home", root / "tmp"
    tmpdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    env = {**os.environ, "SEALED_HOME": str(home), "TMPDIR": str(tmpdir), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "api.cli.main", "up", "--port", str(port), *args],
        env=env, stdout=open(root / "up.log", "wb"), stderr=subprocess.STDOUT,  # noqa: SIM115
        preexec_fn=stop_with_pytest,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"sealed up exited: {(root / 'up.log').read_text()[-3000:]}")
        if ready_line:
            if b"Sealed is up" in (root / "up.log").read_bytes():
                return RunningStack(url, (home / "demo" / "api-key").read_text().strip(), home, tmpdir, proc)
            time.sleep(0.05)
            continue
        try:
            if httpx.get(f"{url}/readyz", timeout=2.0).status_code == 200:
                key = (home / "demo" / "api-key").read_text().strip()
                return RunningStack(url, key, home, tmpdir, proc)
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    # Ctrl-C lets `sealed up` stop its children (they run in their own sessions); kill only if it hangs.
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
    raise TimeoutError("stack did not become ready")


def stop_sealed_up(stack: RunningStack, timeout: float = 30.0) -> int:
    stack.proc.send_signal(signal.SIGINT)
    return stack.proc.wait(timeout)


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningStack]:
    running = start_sealed_up(tmp_path_factory.mktemp("stack"))
    yield running
    if running.proc.poll() is None:
        stop_sealed_up(running)


@pytest.fixture()
def model_id() -> str:
    return DEMO_MODEL


@pytest.fixture()
def sealed_up():  # type: ignore[no-untyped-def]
    """(start, stop) for tests that need their own `sealed up`."""
    return start_sealed_up, stop_sealed_up


def copy_home(src: Path, dst: Path) -> None:
    """A second deployment from a running stack's home: its state without audit logs, witness, logs and
    run files, but with the key broker's state anchor (kept in the audit directory): a broker whose
    anchor is missing refuses to start (issue #46, key_broker/statefile.py)."""
    import shutil

    shutil.copytree(src, dst, dirs_exist_ok=True, ignore=shutil.ignore_patterns("audit", "witness", "logs", "run"))
    anchor = Path("audit") / "key-broker.state-anchor.json"
    (dst / anchor).parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(src / anchor, dst / anchor)
