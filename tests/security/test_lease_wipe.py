"""#33 (worker side): when the tenant withdraws its trust or the lease cannot be renewed, the worker
wipes its key and weights within the lease, stops answering and reports "failed" in its heartbeat.

The worker's clock is injected (enclave_worker/clock.py): no test waits for a lease to run out.
Refusal runs against the real broker in process (its ASGI app as the lease's transport); expiry
against a broker that is unreachable, refuses (403) or fails (500) while the clock moves on.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import httpx
import pytest

from attestation.bundle import channel_binding
from enclave_worker.clock import Clock
from enclave_worker.heartbeat import heartbeat_body
from enclave_worker.keywatch import KeyLease, LeaseTiming
from enclave_worker.lifecycle import revoke, serving
from enclave_worker.sealed import SealedRefusal, open_sealed_request
from enclave_worker.settings import WorkerSettings
from enclave_worker.state import LiveState, WorkerState
from protocol.broker.client import obtain_data_key
from protocol.model_ref import ModelRef
from protocol.rpc import worker_pb2
from tests.key_broker.conftest import Harness
from tests.security.test_keywatch import FakeBooted, released
from tests.security.test_lease_trust import SteppingClock, policy

SCOPE = {"tenant": "acme", "model": "m", "version": "v1"}


@dataclass(frozen=True)
class FakeClock(Clock):
    """The worker's clock, moved by the test (frozen like Clock: the time lives in a list)."""

    t: list[float] = field(default_factory=lambda: [1000.0])

    def monotonic(self) -> float:
        return self.t[0]

    def advance(self, seconds: float) -> None:
        self.t[0] += seconds


def worker_state(tmp: Path, clock: FakeClock) -> tuple[WorkerState, FakeBooted]:
    booted = FakeBooted()
    state = WorkerState(WorkerSettings(broker_url="http://broker", package_dir=tmp, **SCOPE),
                        live=LiveState.serving(booted), clock=clock)  # type: ignore[arg-type]
    return state, booted


def assert_wiped_and_silent(state: WorkerState, booted: FakeBooted, reason: str) -> None:
    assert booted.wiped and booted.engine.wiped  # weights and KV pool zeroed, engine shut down
    assert state.booted is None and not serving(state)
    assert state.live.lease is not None and not state.live.lease.valid()
    assert state.live.lease.released.data_key == b"" and state.live.lease._mac_key == bytes(32)
    assert state.live.status == "failed" and reason in state.live.reason
    # It stops answering with a typed error (sealed and plain requests alike: `serving` is the gate).
    with pytest.raises(SealedRefusal) as refused:
        open_sealed_request(state, worker_pb2.SealedRequest())
    assert refused.value.grpc_code == grpc.StatusCode.UNAVAILABLE
    # Its heartbeat says so: the gateway stops routing to it (test_lease_gateway.py).
    beat = heartbeat_body(state, "127.0.0.1:1", "", 1)
    assert beat["status"] == "failed" and beat["attestation"] is None


# --- refusal: the real broker, the tenant tightens its release policy ---------------------------

@pytest.fixture()
def kb(tmp_path: Path) -> Iterator[Harness]:
    harness = Harness(tmp_path / "kb", SteppingClock())
    yield harness
    harness.close()


def test_a_tightened_policy_wipes_the_worker_at_once(kb: Harness, tmp_path: Path) -> None:
    kb.setup_tenant("acme")
    clock = FakeClock()
    state, booted = worker_state(tmp_path, clock)
    identity = state.identity()
    key = obtain_data_key(kb.client, ModelRef(**SCOPE), make_bundle=kb.bundle,
                          channel_binding=channel_binding(identity.tls_spki, identity.public_key))
    # Long polls of 30 s: the answer can only come early from the policy change's push.
    state.live.lease = lease = KeyLease("http://broker", key, identity, ModelRef(**SCOPE),
                                   LeaseTiming(lease_s=60.0, watch_s=30.0), clock=clock.monotonic,
                                   transport=httpx.ASGITransport(app=kb.app))
    lost: list[str] = []

    async def scenario() -> None:
        task = asyncio.create_task(lease.run(lambda why: (lost.append(why), revoke(state, why))))
        while not kb.app.state.leases.changes._waiters:  # until the renewal is held at the broker
            assert not task.done()
            await asyncio.sleep(0.01)
        assert serving(state)
        await asyncio.to_thread(kb.put_policy, "acme", policy(2, ["ab" * 48]))
        await asyncio.wait_for(task, 60)  # a hang guard: the held renewal would answer after 30 s

    asyncio.run(scenario())
    assert lost == ["revoked"]
    # timed-assert-ok: the injected clock, not the wall clock: it never moved, so the wipe came from the broker
    assert clock.monotonic() == 1000.0
    assert_wiped_and_silent(state, booted, "no longer trusts")
    assert [e["action"] for e in kb.audit_entries() if e["decision"] == "deny"] == ["lease"]


def test_an_unchanged_policy_keeps_the_worker_serving(kb: Harness, tmp_path: Path) -> None:
    """The control for the test above: the same renewals, no change, and the lease is extended."""
    kb.setup_tenant("acme")
    clock = FakeClock()
    state, booted = worker_state(tmp_path, clock)
    identity = state.identity()
    key = obtain_data_key(kb.client, ModelRef(**SCOPE), make_bundle=kb.bundle,
                          channel_binding=channel_binding(identity.tls_spki, identity.public_key))
    state.live.lease = lease = KeyLease("http://broker", key, identity, ModelRef(**SCOPE), LeaseTiming(lease_s=60.0),
                                   clock=clock.monotonic, transport=httpx.ASGITransport(app=kb.app))

    async def renew_twice() -> list[str]:
        async with httpx.AsyncClient(base_url="http://broker", transport=lease.transport) as client:
            out = [await lease.renew(client, 0.0)]
            clock.advance(50.0)
            out.append(await lease.renew(client, 0.0))
            return out

    assert asyncio.run(renew_twice()) == ["active", "active"]
    clock.advance(50.0)  # 100 s after the release: alive only because the second renewal extended it
    assert lease.valid() and serving(state) and not booted.wiped


# --- expiry: the renewal fails until the lease runs out (injected clock) ------------------------

class FailingBroker(httpx.AsyncBaseTransport):
    """Every renewal fails (`status` None: unreachable); each attempt takes 25 s of the worker's clock."""

    def __init__(self, clock: FakeClock, state: WorkerState, status: int | None) -> None:
        self.clock, self.state, self.status = clock, state, status
        self.serving_at_each_attempt: list[bool] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.clock.advance(25.0)
        # Whatever the watcher is doing, no request is served once the lease has run out.
        self.serving_at_each_attempt.append(serving(self.state))
        if self.status is None:
            raise httpx.ConnectError("broker unreachable", request=request)
        return httpx.Response(self.status, json={"error": {"type": "refused", "message": "request refused"}})


@pytest.mark.parametrize("status", [None, 403, 500], ids=["unreachable", "refused", "failing"])
def test_a_lease_that_cannot_be_renewed_wipes_within_the_lease(tmp_path: Path, status: int | None) -> None:
    clock = FakeClock()
    state, booted = worker_state(tmp_path, clock)
    broker = FailingBroker(clock, state, status)
    timing = LeaseTiming(lease_s=60.0, watch_s=20.0, margin_s=5.0, backoff_min_s=0.001, backoff_max_s=0.001)
    state.live.lease = lease = KeyLease("http://broker", released(), state.identity(), ModelRef(**SCOPE), timing,
                                   clock=clock.monotonic, transport=broker)
    lost: list[str] = []

    asyncio.run(asyncio.wait_for(lease.run(lambda why: (lost.append(why), revoke(state, why))), 30))
    assert lost == ["lease-expired"]
    # Served while the lease ran (25 s, 50 s), refused from the first moment past it (75 s).
    assert broker.serving_at_each_attempt == [True, True, False]
    assert_wiped_and_silent(state, booted, "lease ran out")

