"""`sealed up` brings its worker back after the key broker was away: a worker that failed in a way
a fresh start may cure (the broker unreachable at boot, or its key's lease ran out and it wiped the
model) is stopped and started again by the supervisor, and serves once the broker is back
(api/stack_children.py `worker_health`, api/supervisor.py). Before, it stayed "failed" until someone
restarted the whole stack."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any as RunningStack  # the `stack` fixture's type lives in conftest.py

import httpx
import pytest

from api.home import Home
from api.stack import DEMO_MODEL, free_port, launch
from enclave_worker.lifecycle import LOST_REASONS, failure_reason
from protocol.worker_status import restart_may_cure
from tests.api.conftest import copy_home


def _wait(predicate: Callable[[], bool], what: str, timeout: float = 240.0) -> None:
    """A hang guard (what did not happen), not a timing check."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.25)
    raise AssertionError(f"{what}: not seen within {timeout:.0f} s")


def _status(url: str) -> dict:
    try:
        answer: dict = httpx.get(f"{url}/internal/status", timeout=2.0).json()
        return answer
    except (httpx.HTTPError, ValueError):
        return {}


def test_only_failures_a_fresh_start_may_cure_restart_a_worker() -> None:
    assert restart_may_cure("failed", LOST_REASONS["lease-expired"])
    assert restart_may_cure("failed", failure_reason(httpx.ConnectError("refused")))
    assert not restart_may_cure("failed", LOST_REASONS["revoked"])  # the tenant's decision
    assert not restart_may_cure("failed", "key release refused by the key broker")
    assert not restart_may_cure("failed", "attestation failed in the TEE")
    assert not restart_may_cure("ready", LOST_REASONS["lease-expired"])


@pytest.mark.slow
def test_the_worker_serves_again_once_the_key_broker_is_back(stack: RunningStack, tmp_path: Path) -> None:
    copy_home(stack.home, tmp_path / "home")
    home = Home(tmp_path / "home")
    home.create()
    api_key = (home.root / "demo" / "api-key").read_text().strip()
    running = launch(home, port=free_port())
    try:
        running.wait_answering(api_key, DEMO_MODEL, timeout=240)
        sup = running.supervisor
        broker_args, worker = list(sup.children["key-broker"].args), sup.children["worker"]
        sup.remove("key-broker")  # away, and not restarted by the supervisor until we say so
        first_pid = worker.pid
        assert first_pid is not None
        os.kill(first_pid, signal.SIGKILL)  # the restarted worker boots while the broker is away
        _wait(lambda: worker.pid != first_pid and _status(running.worker_url).get("reason") == "key broker unreachable",
              "the restarted worker reporting the broker unreachable")
        sup.start("key-broker", broker_args, on_restart=running.write_pids)
        running.wait_answering(api_key, DEMO_MODEL, timeout=240)  # raises if the worker never comes back
        assert worker.restarts >= 2  # the kill, then the supervisor's own restart of the failed worker
        assert _status(running.worker_url).get("status") == "ready"
    finally:
        running.stop()
