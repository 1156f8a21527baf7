"""#13 finding 2: a worker is declared dead by health checks (heartbeats), never by one request's error."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from api.gateway.liveness import LoopClock
from protocol.rpc import worker_pb2, worker_pb2_grpc
from tests.security.harness import gateway


class Erring(worker_pb2_grpc.WorkerServicer):
    """Fails every request with the status code named by its prompt."""

    def __init__(self, state) -> None:  # type: ignore[no-untyped-def]
        self.state = state

    async def Status(self, request: worker_pb2.StatusRequest, context: grpc.aio.ServicerContext
                     ) -> worker_pb2.StatusReply:
        return worker_pb2.StatusReply(status="ready")

    async def Generate(self, request: worker_pb2.GenerateRequest, context: grpc.aio.ServicerContext
                       ) -> AsyncIterator[worker_pb2.GenerateChunk]:
        if request.prompt == "RAISE":
            raise TypeError("tokenizer bug")  # what an unhandled worker bug looks like: UNKNOWN
        await context.abort(getattr(grpc.StatusCode, request.prompt), "boom")
        yield worker_pb2.GenerateChunk()


@pytest.mark.parametrize("prompt,status", [
    ("RAISE", 500), ("UNKNOWN", 500), ("INTERNAL", 500), ("INVALID_ARGUMENT", 400),
    ("RESOURCE_EXHAUSTED", 413), ("UNAVAILABLE", 503),
])
async def test_a_request_error_never_marks_a_worker_dead(tmp_path: Path, prompt: str, status: int) -> None:
    async with gateway(tmp_path, [Erring, Erring]) as gw:
        for _ in range(3):
            r = await gw.client.post("/v1/completions", headers=gw.headers(),
                                     json={"model": "m", "prompt": prompt, "max_tokens": 1})
            assert r.status_code == status, r.text
            assert r.json()["error"]["message"]
        registry = gw.service.registry
        assert not any(w.dead for w in registry.workers.values())
        assert len(registry.ready("acme", "m")) == 2


class Gone(Erring):
    async def Status(self, request: worker_pb2.StatusRequest, context: grpc.aio.ServicerContext
                     ) -> worker_pb2.StatusReply:
        await context.abort(grpc.StatusCode.UNAVAILABLE, "shutting down")
        return worker_pb2.StatusReply()


async def test_a_worker_that_fails_its_health_check_leaves_rotation(tmp_path: Path) -> None:
    async with gateway(tmp_path, [Gone]) as gw:
        r = await gw.client.post("/v1/completions", headers=gw.headers(),
                                 json={"model": "m", "prompt": "UNAVAILABLE", "max_tokens": 1})
        assert r.status_code == 503
        for _ in range(50):
            if gw.service.registry.ready("acme", "m") == []:
                return
            await asyncio.sleep(0.05)
        raise AssertionError("the probe did not take the unhealthy worker out of rotation")


class Hung(Erring):
    async def Status(self, request: worker_pb2.StatusRequest, context: grpc.aio.ServicerContext
                     ) -> worker_pb2.StatusReply:
        await asyncio.sleep(5.0)  # past any probe's deadline
        return worker_pb2.StatusReply(status="ready")


class Loading(Erring):
    async def Status(self, request: worker_pb2.StatusRequest, context: grpc.aio.ServicerContext
                     ) -> worker_pb2.StatusReply:
        return worker_pb2.StatusReply(status="loading")


@pytest.mark.parametrize("servicer,clock_running,leaves", [
    (Hung, False, False),  # silence, and nothing measured the gateway's own loop: inconclusive
    (Hung, True, True),  # silence while the gateway's loop kept time: the worker hung
    (Loading, False, True),  # an answer, not ready: no loop stall makes that up
    (Gone, False, True),  # refused: the same
])
async def test_what_a_failed_health_check_proves(tmp_path: Path, servicer: type, clock_running: bool,
                                                 leaves: bool) -> None:
    async with gateway(tmp_path, [servicer]) as gw:
        service = gw.service
        service.probe_timeout_s = 0.2
        if clock_running:
            service.registry.clock = LoopClock(tick_s=0.02)
            service.registry.clock.start()
        r = await gw.client.post("/v1/completions", headers=gw.headers(),
                                 json={"model": "m", "prompt": "UNAVAILABLE", "max_tokens": 1})
        assert r.status_code == 503
        for _ in range(100):  # the probe runs as its own task
            if not service._probing:
                break
            await asyncio.sleep(0.02)
        assert not service._probing, "the probe never finished"
        assert (service.registry.ready("acme", "m") == []) is leaves
        await service.registry.clock.stop()
