"""Finding 1 end to end against a real key broker process: while the status and lease endpoints
are flooded with the public token, a revocation still stops the worker (wipe, no serving) within
5 s; and a broker killed with SIGKILL and restarted does not take the worker down (issue #20)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from attestation.bundle import channel_binding
from enclave_worker.keywatch import KeyLease, LeaseTiming
from enclave_worker.lifecycle import revoke, serving
from enclave_worker.settings import WorkerSettings
from enclave_worker.state import LiveState, WorkerState
from protocol.broker.client import WorkerIdentity, obtain_data_key
from protocol.model_ref import ModelRef
from tests.key_broker.conftest import SIGNER, sealed_key_upload
from tests.key_broker.test_broker_process import MEASUREMENT, BrokerProcess
from tests.security.test_keywatch import FakeBooted

SCOPE = {"tenant": "acme", "model": "m", "version": "v1"}


@pytest.fixture()
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    proc = BrokerProcess(tmp_path)
    proc.extra_args = ["--rate-limit-per-minute", "60"]  # so the flood drains what it can within seconds
    proc.start()
    yield proc
    if proc.proc is not None and proc.proc.poll() is None:
        proc.proc.kill()
        proc.proc.wait()


def setup_tenant(broker: BrokerProcess) -> None:
    pem = httpx.get(f"{broker.url}/v1/import-key", timeout=10).json()["public_key_pem"]
    body, _ = sealed_key_upload(pem, "acme", "m", "v1")
    assert broker.admin("POST", "/tenants/acme/key").status_code == 201
    assert broker.admin("PUT", "/tenants/acme/models/m/versions/v1/data-key", json=body,
                        token=broker.tenant_token("acme")).status_code == 201
    policy = {"policy_id": "acme-m", "version": 1, "tenant": "acme", "model": "m", "allowed_tee": ["sim"],
              "allowed_measurements": [MEASUREMENT.hex()], "required_signer": SIGNER,
              "unsafe_allow_simulated_tee": True}
    assert broker.put_signed_policy("acme", policy).status_code == 200


class RunningWorker:
    """A worker's state and key lease as `enclave_worker.lifecycle` runs them (engine stood in)."""

    def __init__(self, broker: BrokerProcess, tmp: Path, timing: LeaseTiming) -> None:
        self.identity = WorkerIdentity(Ed25519PrivateKey.generate())
        with httpx.Client(base_url=broker.url, timeout=10) as client:
            self.released = obtain_data_key(client, ModelRef(**SCOPE), make_bundle=broker.make_bundle,
                                            channel_binding=channel_binding(b"", self.identity.public_key))
        self.booted = FakeBooted()
        self.state = WorkerState(WorkerSettings(broker_url=broker.url, package_dir=tmp, **SCOPE),
                                 live=LiveState.serving(self.booted))  # type: ignore[arg-type]
        self.state.live.lease = KeyLease(broker.url, self.released, self.identity, ModelRef(**SCOPE), timing=timing)
        self.lost: list[tuple[str, float]] = []

        def on_lost(reason: str) -> None:
            self.lost.append((reason, time.monotonic()))
            revoke(self.state)

        self.thread = threading.Thread(target=lambda: asyncio.run(self.state.live.lease.run(on_lost)),  # type: ignore[union-attr]
                                       daemon=True)
        self.thread.start()


class Flood:
    """The red-team flood: the public token (as served on /.well-known/attestation) sent to the
    status and lease endpoints as fast as `rate` allows."""

    def __init__(self, broker: BrokerProcess, token: str, rate: float = 100.0, threads: int = 2) -> None:
        self.stop = threading.Event()
        self.codes: dict[int, int] = {}
        self._lock = threading.Lock()
        forged = {**SCOPE, "token": token, "tls_spki": "", "identity_key": "00" * 32, "seq": 1, "at": int(time.time()),
                  "wait_s": 0.0, "signature": "00" * 64}
        status = {**SCOPE, "token": token}

        def run() -> None:
            with httpx.Client(base_url=broker.url, timeout=5) as client:
                i = 0
                while not self.stop.is_set():
                    started = time.monotonic()
                    try:
                        r = client.post("/v1/key/status" if i % 2 == 0 else "/v1/lease",
                                        json=status if i % 2 == 0 else forged)
                        with self._lock:
                            self.codes[r.status_code] = self.codes.get(r.status_code, 0) + 1
                    except httpx.HTTPError:
                        pass
                    i += 1
                    time.sleep(max(0.0, threads / rate - (time.monotonic() - started)))

        self.threads = [threading.Thread(target=run, daemon=True) for _ in range(threads)]
        for t in self.threads:
            t.start()

    def close(self) -> dict[int, int]:
        self.stop.set()
        for t in self.threads:
            t.join(10)
        return self.codes


def wait_for(predicate: Any, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()


def test_flood_then_revoke_stops_the_worker_within_5_seconds(broker: BrokerProcess, tmp_path: Path) -> None:
    setup_tenant(broker)
    worker = RunningWorker(broker, tmp_path, LeaseTiming())  # production timing: 60 s lease, 20 s holds
    flood = Flood(broker, worker.released.token)
    try:
        # The flood runs until it has drained what the public token can reach (429s); the worker's
        # lease is held open at the broker meanwhile.
        assert wait_for(lambda: flood.codes.get(429, 0) > 0 and flood.codes.get(403, 0) > 0, 60), flood.codes
        assert serving(worker.state)
        revoked_at = time.monotonic()
        assert broker.admin("POST", "/tenants/acme/key/revoke").status_code == 200
        assert wait_for(lambda: worker.lost, 5.0), "the worker still served 5 s after the revocation"
    finally:
        codes = flood.close()
    reason, at = worker.lost[0]
    assert reason == "revoked" and at - revoked_at < 5.0
    assert worker.booted.wiped and worker.booted.engine.wiped and not serving(worker.state)
    assert worker.state.live.status == "failed"
    assert sum(codes.values()) > 100 and codes.get(429, 0) > 0 and codes.get(403, 0) > 0, codes


def test_a_broker_killed_and_restarted_does_not_take_the_worker_down(broker: BrokerProcess, tmp_path: Path) -> None:
    setup_tenant(broker)
    worker = RunningWorker(broker, tmp_path, LeaseTiming(lease_s=30.0, watch_s=2.0, margin_s=1.0))
    lease = worker.state.live.lease
    assert lease is not None
    assert wait_for(lambda: lease._seq >= 2, 10)  # renewed at once, then holding
    assert broker.proc is not None
    broker.proc.kill()  # kill -9
    broker.proc.wait()
    time.sleep(3.0)
    assert serving(worker.state) and not worker.lost  # the lease outlives a short outage
    broker.start()
    before = lease.expires_at
    assert wait_for(lambda: lease.expires_at > before, 15), "no renewal after the broker came back"
    assert serving(worker.state) and not worker.lost
    # And the restarted broker still pushes a revocation.
    revoked_at = time.monotonic()
    assert broker.admin("POST", "/tenants/acme/key/revoke").status_code == 200
    assert wait_for(lambda: worker.lost, 5.0)
    assert worker.lost[0][0] == "revoked" and worker.lost[0][1] - revoked_at < 5.0 and worker.booted.wiped
