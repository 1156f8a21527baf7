"""A warm worker (enclave_worker/standby.py) as a real process on the simulated TEE beside `sealed up`: it
boots and attests without a key, says standby, and only on assignment attests afresh, gets the key,
decrypts and serves; its start's phases are in its status. The orchestrator's runtime drives it."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any as RunningStack  # the `stack` fixture's type lives in conftest.py

import httpx
import pytest

from api.home import Home
from api.orchestrator.local import LocalRuntime, LocalWorker
from api.stack import DEMO_MODEL, DEMO_TENANT, DEMO_VERSION, free_port, worker_args
from api.supervisor import Supervisor
from protocol.model_ref import ModelRef
from tests.api.conftest import stop_with_pytest

STATUS_WITHIN_S = 300.0  # a loaded 2-core machine; no assertion on how long it took


def wait_for(worker: LocalWorker, runtime: LocalRuntime, wanted: str) -> dict:
    deadline = time.monotonic() + STATUS_WITHIN_S
    status: dict = {}
    while time.monotonic() < deadline:
        status = runtime.status(worker)
        if status.get("status") in (wanted, "failed"):
            break
        time.sleep(0.5)
    assert status.get("status") == wanted, status
    return status


@pytest.fixture(scope="module")
def standby(stack: RunningStack,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalWorker, LocalRuntime]]:
    home = Home(stack.home)
    urls = json.loads((home.root / "run" / "pids.json").read_text())
    root = tmp_path_factory.mktemp("standby")
    runtime = LocalRuntime(home, Supervisor(root / "run"), urls["broker_url"], stack.url,
                           root / "unused-token", root / "unused-cert")
    port = free_port()
    # The demo worker's own arguments (its measurement is the one the demo's release policy allows),
    # registered with no gateway: the test alone talks to it.
    args = [*worker_args(home, urls["broker_url"], port, free_port(), []), "--standby"]
    proc = subprocess.Popen([sys.executable, "-m", *args], stdout=open(root / "worker.log", "wb"),  # noqa: SIM115
                            stderr=subprocess.STDOUT, preexec_fn=stop_with_pytest)
    worker = LocalWorker("standby", ModelRef(DEMO_TENANT, DEMO_MODEL, DEMO_VERSION), f"http://127.0.0.1:{port}", 0.0)
    deadline = time.monotonic() + STATUS_WITHIN_S
    while not runtime.status(worker) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.5)
    yield worker, runtime
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
    assert b"Traceback" not in Path(root / "worker.log").read_bytes()


def test_a_standby_worker_attests_without_a_key_then_serves_on_assignment(
        standby: tuple[LocalWorker, LocalRuntime]) -> None:
    worker, runtime = standby
    status = wait_for(worker, runtime, "standby")
    # Attested and waiting, but nothing of the model: no key, no engine, no attestation to serve.
    assert status["load_s"] is None and "num_kv_blocks" not in status["stats"]
    assert set(k for k in status["stats"] if k.startswith("sealed:cold_start_")) == {"sealed:cold_start_boot_seconds"}
    assert httpx.get(f"{worker.http_url}/internal/attestation", timeout=5).status_code == 503
    assert httpx.get(f"{worker.http_url}/internal/readyz", timeout=5).status_code == 503

    assert runtime.assign(worker)
    assert not runtime.assign(worker)  # one assignment only (409)
    status = wait_for(worker, runtime, "ready")
    phases = {k.removeprefix("sealed:cold_start_").removesuffix("_seconds")
              for k in status["stats"] if k.startswith("sealed:cold_start_")}
    # Registered with no gateway: no "announce"; first_request and first_token: once it answers.
    assert phases == {"boot", "assign", "broker", "attest", "release", "decrypt", "load"}
    assert status["stats"]["num_kv_blocks"] > 0 and status["load_s"] > 0
    doc = httpx.get(f"{worker.http_url}/internal/attestation", timeout=5).json()
    assert doc["tee"] == "sim" and doc["token"]  # the evidence made at assignment, with its token


def test_a_worker_that_was_not_started_standby_refuses_an_assignment(stack: RunningStack) -> None:
    pids = json.loads((Path(stack.home) / "run" / "pids.json").read_text())
    assert httpx.post(f"{pids['worker_url']}/internal/assign", timeout=5).status_code in (404, 405)
