"""The delivery probe: round trips to real gRPC servers, queueing delay above each worker's base."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import grpc
import pytest

from api.gateway.delivery_probe import BaseDelay, DeliveryProbe, ProbePolicy
from api.gateway.grpc_client import WorkerClients
from api.gateway.registry import WorkerInfo, WorkerRegistry
from api.stack import free_port
from protocol.model_ref import ModelRef
from protocol.rpc import worker_pb2, worker_pb2_grpc


class SlowStatus(worker_pb2_grpc.WorkerServicer):
    def __init__(self) -> None:
        self.delay_s = 0.0
        self.calls = 0

    async def Status(self, request: worker_pb2.StatusRequest, context: grpc.aio.ServicerContext
                     ) -> worker_pb2.StatusReply:
        self.calls += 1
        await asyncio.sleep(self.delay_s)
        return worker_pb2.StatusReply(status="ready")


@pytest.fixture()
async def server() -> AsyncIterator[tuple[str, SlowStatus]]:
    servicer, srv = SlowStatus(), grpc.aio.server()
    worker_pb2_grpc.add_WorkerServicer_to_server(servicer, srv)
    address = f"127.0.0.1:{free_port()}"
    srv.add_insecure_port(address)
    await srv.start()
    yield address, servicer
    await srv.stop(0)


def _registry(*addresses: str) -> WorkerRegistry:
    registry = WorkerRegistry()
    for i, address in enumerate(addresses):
        registry.workers[f"w{i}"] = WorkerInfo(f"w{i}", address, ModelRef("t", "m", "v1"), "ready", "sim", True,
                                               "", last_seen=registry.clock.now())
    return registry


def test_the_base_is_the_window_minimum_and_old_minima_expire() -> None:
    base = BaseDelay(ProbePolicy(base_window_s=10.0, base_bucket_s=2.0))
    assert base.add(0.0, 0.004) == 0.004
    assert base.add(1.0, 0.001) == 0.001
    assert base.add(5.0, 0.020) == 0.001  # still within the window
    assert base.add(12.5, 0.003) == 0.003  # the bucket holding 0.001 is older than the window


async def test_a_slow_answer_reports_its_queueing_delay_above_the_base(server: tuple[str, SlowStatus]) -> None:
    address, servicer = server
    clients = WorkerClients()
    probe = DeliveryProbe(_registry(address), clients, ProbePolicy(timeout_s=2.0))
    seen: list[float] = []
    probe.on_delay(seen.append)
    try:
        for _ in range(3):
            await probe.probe_once()
        assert max(seen) < 0.05  # quick answers: near the base
        servicer.delay_s = 0.15
        assert await probe.probe_once() >= 0.12
    finally:
        await clients.close()


async def test_an_unanswered_probe_reports_its_timeout_and_an_error_status_counts_as_an_answer(
        server: tuple[str, SlowStatus]) -> None:
    address, servicer = server
    unimplemented = grpc.aio.server()  # no Worker service: every call answers UNIMPLEMENTED
    other = f"127.0.0.1:{free_port()}"
    unimplemented.add_insecure_port(other)
    await unimplemented.start()
    clients = WorkerClients()
    policy = ProbePolicy(timeout_s=0.3)
    try:
        probe = DeliveryProbe(_registry(other), clients, policy)
        await probe.probe_once()
        assert await probe.probe_once() < 0.1  # an error status came back over the same path
        probe = DeliveryProbe(_registry(address), clients, policy)
        await probe.probe_once()  # base: a quick answer
        servicer.delay_s = 5.0
        assert await probe.probe_once() >= 0.25  # timed out: reported as (about) the timeout
    finally:
        await clients.close()
        await unimplemented.stop(0)


async def test_no_ready_worker_no_probe_and_the_probe_task_survives_errors(server: tuple[str, SlowStatus]) -> None:
    registry = WorkerRegistry()
    clients = WorkerClients()
    probe = DeliveryProbe(registry, clients, ProbePolicy(interval_s=0.01))
    assert await probe.probe_once() is None
    registry.workers["gone"] = WorkerInfo("gone", f"127.0.0.1:{free_port()}", ModelRef("t", "m", "v1"), "ready",
                                          "sim", True, "", last_seen=registry.clock.now())  # nothing listens
    assert await probe.probe_once() is None  # no connection: no sample (health checks judge the worker)
    assert not clients._channels  # and its channel is closed, as a request's call closes it
    del registry.workers["gone"]
    calls: list[float] = []

    def failing(delay: float) -> None:
        calls.append(delay)
        raise RuntimeError("an observer's bug")

    probe.on_delay(failing)
    registry.workers["w"] = WorkerInfo("w", server[0], ModelRef("t", "m", "v1"), "ready", "sim", True, "",
                                       last_seen=registry.clock.now())
    probe.start()
    try:
        await asyncio.sleep(0.5)
        assert probe._task is not None and not probe._task.done()  # logged, and it goes on probing
    finally:
        await probe.stop()
        await clients.close()
    assert len(calls) >= 2


async def test_a_worker_that_left_the_registry_loses_its_base_and_channel(server: tuple[str, SlowStatus]) -> None:
    registry = _registry(server[0])
    clients = WorkerClients()
    probe = DeliveryProbe(registry, clients)
    try:
        await probe.probe_once()
        assert len(clients._channels) == 1 and set(probe._bases) == {"w0"}
        del registry.workers["w0"]  # a restarted worker: the same address and certificate, a new id
        registry.workers["w1"] = WorkerInfo("w1", server[0], ModelRef("t", "m", "v1"), "ready", "sim", True, "",
                                            last_seen=registry.clock.now())
        assert await probe.probe_once() is not None
        assert set(probe._bases) == {"w1"} and len(clients._channels) == 1  # its channel is still in use
        del registry.workers["w1"]
        registry.workers["w2"] = WorkerInfo("w2", server[0], ModelRef("t", "m", "v1"), "ready", "sim", True, "",
                                            tls_cert="another", last_seen=registry.clock.now())
        await probe.probe_once()  # w2's channel opens; w1's, no longer anyone's, is closed
        assert set(probe._bases) == {"w2"} and [k[1] for k in clients._channels] == ["another"]
    finally:
        await clients.close()


async def _until(condition: Callable[[], bool]) -> None:
    for _ in range(1000):  # a bound on the wait, not a timing being tested
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the condition never held")


async def test_an_idle_gateway_probes_only_to_keep_the_base_and_a_busy_one_at_full_rate(
        server: tuple[str, SlowStatus]) -> None:
    """Idle, the probe made 20 round trips a second that every request competed with for CPU."""
    address, servicer = server
    clients = WorkerClients()
    busy = [False]
    probe = DeliveryProbe(_registry(address), clients, ProbePolicy(interval_s=0.01, idle_interval_s=3600.0))
    probe.busy_when(lambda: busy[0])
    seen: list[float] = []
    probe.on_delay(seen.append)
    probe.start()
    try:
        await _until(lambda: len(seen) == 1)  # the first tick probes: the base
        await asyncio.sleep(0.3)  # thirty ticks, none of them due a probe while idle
        assert len(seen) == 1 and servicer.calls == 1
        busy[0] = True
        await _until(lambda: len(seen) >= 5)  # in flight: every tick probes
    finally:
        await probe.stop()
        await clients.close()
