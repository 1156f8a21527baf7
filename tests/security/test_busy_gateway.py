"""#13 flood acceptance: a gateway too busy to read heartbeats never declares a live worker dead.

The flood benchmark found healthy workers marked dead (and quiet requests answered 503) because the
gateway's saturated event loop, and its default thread pool busy with usage writes, handled the
workers' heartbeats late. Heartbeat age is now measured on the gateway's loop-lag-adjusted clock
(`api/gateway/liveness.py`), heartbeats are stamped on arrival and verified on the registry's own
thread, and keys seen in the last second are not looked up again on a thread.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path

import grpc

from api.gateway.liveness import LoopClock
from protocol.rpc import worker_pb2, worker_pb2_grpc
from tests.security.harness import gateway


class Answering(worker_pb2_grpc.WorkerServicer):
    def __init__(self, state) -> None:  # type: ignore[no-untyped-def]
        self.state = state

    async def Status(self, request: worker_pb2.StatusRequest, context: grpc.aio.ServicerContext
                     ) -> worker_pb2.StatusReply:
        return worker_pb2.StatusReply(status="ready")

    async def Generate(self, request: worker_pb2.GenerateRequest, context: grpc.aio.ServicerContext
                       ) -> AsyncIterator[worker_pb2.GenerateChunk]:
        yield worker_pb2.GenerateChunk(text="ok", prompt_tokens=1, completion_tokens=1, finish_reason="length")


def hog_the_loop(seconds: float) -> None:
    """What relaying tens of thousands of chunks a second does to the loop: it runs, but late."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(0.25)


async def test_a_saturated_loop_does_not_kill_live_workers_and_a_dead_one_still_leaves(tmp_path: Path) -> None:
    async with gateway(tmp_path, [Answering, Answering], heartbeat_timeout_s=1.0) as gw:
        registry = gw.service.registry
        registry.clock = LoopClock(tick_s=0.05)
        registry.clock.start()
        await gw.beat()
        assert len(registry.ready("acme", "m")) == 2
        # 3x the heartbeat timeout with the loop blocked, then a loop that turns only every 250 ms:
        # no heartbeat could be read meanwhile, through no fault of the workers.
        time.sleep(3.0)
        for _ in range(8):
            hog_the_loop(0.25)
            await asyncio.sleep(0)
        assert len(registry.ready("acme", "m")) == 2, "a busy gateway declared live workers dead"
        r = await gw.client.post("/v1/completions", headers=gw.headers(), json={"model": "m", "prompt": "x"})
        assert r.status_code == 200, r.text
        # With the loop responsive, workers that stop heartbeating do leave rotation.
        for _ in range(200):
            if not registry.ready("acme", "m"):
                break
            await asyncio.sleep(0.05)
        assert not registry.ready("acme", "m"), "silent workers stayed in rotation on a responsive gateway"
        assert registry.clock.stalled_s > 3.0  # the lag was measured, not ignored
        await registry.clock.stop()


async def test_heartbeats_and_known_keys_do_not_wait_for_the_busy_thread_pool(tmp_path: Path) -> None:
    async with gateway(tmp_path, [Answering]) as gw:
        r = await gw.client.post("/v1/completions", headers=gw.headers(), json={"model": "m", "prompt": "x"})
        assert r.status_code == 200  # the key is known now
        release = threading.Event()
        # Every thread of the default executor busy (what thousands of usage writes a second did).
        blockers = [asyncio.create_task(asyncio.to_thread(release.wait, 60)) for _ in range(64)]
        try:
            await asyncio.sleep(0.1)
            await asyncio.wait_for(gw.beat(), 30)
            r = await asyncio.wait_for(gw.client.post("/v1/completions", headers=gw.headers(),
                                                      json={"model": "m", "prompt": "x"}), 30)
            assert r.status_code == 200, r.text
            assert not any(b.done() for b in blockers)  # served while the pool was still blocked
        finally:
            release.set()
            await asyncio.gather(*blockers)


def test_the_clock_counts_at_most_one_tick_per_late_turn() -> None:
    clock = LoopClock(tick_s=0.05)

    async def run() -> tuple[float, float]:
        clock.start()
        await asyncio.sleep(0.1)
        before = clock.now()
        time.sleep(1.0)  # the loop is stuck: the clock must not have moved by a second
        during = clock.now()
        await asyncio.sleep(0.2)
        await clock.stop()
        return before, during

    before, during = asyncio.run(run())
    assert during - before <= 0.05 + 1e-6
    assert clock.stalled_s >= 0.9


class Burst(Answering):
    async def Generate(self, request: worker_pb2.GenerateRequest, context: grpc.aio.ServicerContext
                       ) -> AsyncIterator[worker_pb2.GenerateChunk]:
        n = request.params.max_tokens
        for i in range(n):  # no pause: chunks pile up faster than one write each
            yield worker_pb2.GenerateChunk(text=f"t{i} ", prompt_tokens=1, completion_tokens=i + 1,
                                           finish_reason="length" if i == n - 1 else "")


async def test_coalesced_stream_keeps_every_event_in_order_and_ends(tmp_path: Path) -> None:
    """Events written together under load are still every event, in order, and the response ends
    (a reader that waits for the end of the body, not only for [DONE], is not left hanging)."""
    async with gateway(tmp_path, [Burst]) as gw:
        for body in ({"model": "m", "prompt": "x", "max_tokens": 200, "stream": True},
                     {"model": "m", "prompt": "x", "max_tokens": 50, "n": 3, "stream": True}):
            async def read_all(body: dict = body) -> list[str]:
                async with gw.client.stream("POST", "/v1/completions", headers=gw.headers(), json=body) as r:
                    assert r.status_code == 200
                    return [line async for line in r.aiter_lines() if line.startswith("data: ")]

            events = await asyncio.wait_for(read_all(), 60)
            assert events[-1] == "data: [DONE]"
            texts: dict[int, str] = {}
            for e in events[:-1]:
                choice = json.loads(e[6:])["choices"][0]
                texts[choice["index"]] = texts.get(choice["index"], "") + choice["text"]
            want = "".join(f"t{i} " for i in range(body["max_tokens"]))
            assert texts == dict.fromkeys(range(body.get("n", 1)), want)
