"""#13 finding 9: a client that disconnects cancels its generation in the worker (non-streamed
requests too, and while still waiting for its first token)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import httpx
import pytest

from protocol.rpc import worker_pb2
from tests.api.fake_worker import FakeServicer
from tests.security.harness import gateway, http_server


class Counting(FakeServicer):
    active = 0

    async def Generate(self, request: worker_pb2.GenerateRequest, context: grpc.aio.ServicerContext
                       ) -> AsyncIterator[worker_pb2.GenerateChunk]:
        type(self).active += 1
        try:
            async for chunk in super().Generate(request, context):
                yield chunk
        finally:
            type(self).active -= 1


@pytest.mark.parametrize("route,body", [
    ("/v1/completions", {"model": "m", "prompt": "x", "max_tokens": 400}),
    ("/v1/completions", {"model": "m", "prompt": ["x", "y"], "n": 2, "max_tokens": 400}),
    ("/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 400}),
    ("/v1/completions", {"model": "m", "prompt": "x", "max_tokens": 400, "stream": True}),
])
async def test_a_disconnecting_client_cancels_its_generation(tmp_path: Path, route: str, body: dict) -> None:
    Counting.active = 0
    async with gateway(tmp_path, [lambda state: Counting(state, 0.05)]) as gw, http_server(gw.client._transport.app  # type: ignore[attr-defined]
                                                                                         ) as url:
        async with httpx.AsyncClient(base_url=url) as client:
            if body.get("stream"):
                async with client.stream("POST", route, json=body, headers=gw.headers(), timeout=5.0) as r:
                    async for i, _ in _enumerate(r.aiter_lines()):
                        if i > 3:
                            break  # leaving the block closes the connection
            else:
                with pytest.raises(httpx.ReadTimeout):
                    await client.post(route, json=body, headers=gw.headers(), timeout=1.0)
        assert Counting.active > 0 or gw.service.admission.running == 0
        for _ in range(60):  # 400 tokens at 50 ms would run 20 s: cancelled well before
            if Counting.active == 0 and gw.service.admission.running == 0:
                return
            await asyncio.sleep(0.05)
        raise AssertionError(f"{Counting.active} generations still run after the client left")


async def _enumerate(items: AsyncIterator[str]) -> AsyncIterator[tuple[int, str]]:
    i = 0
    async for item in items:
        yield i, item
        i += 1
