"""The HTTP side of a request's answer: a streamed body that settles its lifecycle however the
client leaves (lifecycle.py), waiting that a client's disconnect cancels, and request ids."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from api.gateway.errors import GatewayError


class CleanupStreamingResponse(StreamingResponse):
    """Runs `cleanup` even when the client leaves before the body iterator ever starts; and
    coalesces: events produced while the previous write was under way go out in one write.

    Unloaded, every event is written as it comes (nothing waits for a batch to fill). Under load the
    writer falls behind the producer, and then one HTTP write carries every event that is ready:
    the per-write cost (the HTTP layer's framing, a syscall) is paid per batch, not per token.
    """

    max_pending = 256  # events buffered ahead of a slow client before the producer waits

    def __init__(self, content: AsyncIterator[bytes], cleanup: Callable[[], Awaitable[None]], **kw: Any) -> None:
        super().__init__(content, **kw)
        self._cleanup = cleanup

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self._cleanup()

    async def stream_response(self, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        pending: list[bytes] = []
        ready, drained = asyncio.Event(), asyncio.Event()
        finished = False

        async def produce() -> None:
            nonlocal finished
            try:
                async for event in self.body_iterator:
                    # Our content is bytes; starlette's type also allows str (encoded as starlette does).
                    data = event.encode(self.charset) if isinstance(event, str) else event
                    pending.append(data if isinstance(data, bytes) else bytes(data))
                    ready.set()
                    if len(pending) >= self.max_pending:
                        drained.clear()
                        await drained.wait()
            finally:
                finished = True
                ready.set()

        producer = asyncio.create_task(produce())
        try:
            while True:
                if not pending and not finished:
                    ready.clear()  # nothing to write: wait for the producer (no await since the check)
                    await ready.wait()
                if pending:
                    body = pending[0] if len(pending) == 1 else b"".join(pending)
                    pending.clear()
                    drained.set()
                    await send({"type": "http.response.body", "body": body, "more_body": True})
                elif finished:
                    break
            await producer  # re-raises what the body raised
        finally:
            if not producer.done():
                producer.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await producer
        await send({"type": "http.response.body", "body": b"", "more_body": False})


T = TypeVar("T")


async def unless_disconnected(receive: Receive, work: Awaitable[T]) -> T:
    """Run `work` (waiting for a slot, a non-streamed answer) but cancel it, and so the worker's
    generation, as soon as the client disconnects. Streamed answers get this from the response."""
    task = asyncio.ensure_future(work)

    async def disconnected() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass

    watcher = asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        task.cancel()
        raise
    finally:
        watcher.cancel()
    if not task.done():
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
        raise GatewayError(499, "the client closed the request", code="client_closed_request")
    return task.result()


def request_id() -> str:
    return secrets.token_hex(12)
