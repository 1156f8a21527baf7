"""One OpenAI request as it runs: admission slot, n choices on workers, timing, clean-up.

Everything up to each choice's first chunk happens before the HTTP response starts, so admission
refusals, unavailable models and invalid prompts come back as proper status codes, not mid-stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from api.gateway.admission import Ticket
from api.gateway.errors import GatewayError
from api.gateway.priority_loop import mark_urgent
from api.gateway.service import GatewayService
from api.store.repo import KeyRecord
from protocol.openai.runner import ChoiceResult, collect_choice, merge_streams, prepend
from protocol.rpc import worker_pb2
from protocol.tracing import NULL_SPAN, Span


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


class Run:
    def __init__(self, service: GatewayService, key: KeyRecord, model: str, ticket: Ticket,
                 span: Span = NULL_SPAN) -> None:
        self.service, self.key, self.model, self.ticket = service, key, model, ticket
        self.span = span  # gateway.request (spans.py); ended by close()
        # A request of a tenant with little in flight runs ahead of the others in each loop turn
        # (priority_loop.py). Marked here, in the request's own task, before start() and the
        # relaying run in tasks of their own, which take this mark with them.
        mark_urgent(service.admission.light(ticket.tenant, ticket.streams))
        self.started = time.monotonic()
        self._stack = contextlib.AsyncExitStack()
        self.used_tokens = self.prompt_tokens = self.completion_tokens = 0
        self._closed = False

    async def start(self, split: dict[str, float], requests: list[worker_pb2.GenerateRequest], affinity: str
                    ) -> list[AsyncIterator[worker_pb2.GenerateChunk]]:
        """Wait for a slot, open every choice and read its first chunk; returns the chunk streams."""
        try:
            waiting = self.service.tracing.start("gateway.admission", self.span.context)
            try:
                await self._stack.enter_async_context(self.service.admission.slot(self.ticket))
            except GatewayError as exc:
                waiting.end(error=exc.code or "refused")
                self.service.audit_refusal(self.key, "queue", exc)
                raise
            waiting.end()
            streams = [self.service.stream(self.key, self.model, split, r, affinity, self.span) for r in requests]
            for s in streams:
                self._stack.push_async_callback(s.aclose)
            firsts = await asyncio.gather(*(anext(s) for s in streams))
        except BaseException:
            await self.close()
            raise
        self.service.metrics.ttft.labels(self.model).observe(time.monotonic() - self.started)
        self.service.demand.ttft(self.key.tenant, self.model, time.monotonic() - self.started)
        return [prepend(f, s) for f, s in zip(firsts, streams, strict=True)]

    def account(self, chunk: worker_pb2.GenerateChunk) -> None:
        if chunk.finish_reason:
            self.used_tokens += chunk.prompt_tokens + chunk.completion_tokens
            self.prompt_tokens += chunk.prompt_tokens
            self.completion_tokens += chunk.completion_tokens
            self.service.metrics.requests.labels(self.key.tenant, chunk.finish_reason).inc()

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            await self._stack.aclose()
        finally:
            self.service.admission.settle(self.ticket, self.used_tokens)
            self.service.metrics.e2e.labels(self.model).observe(time.monotonic() - self.started)
            if self.service.tracing.enabled:
                self.span.set("gen_ai.usage.input_tokens", self.prompt_tokens)
                self.span.set("gen_ai.usage.output_tokens", self.completion_tokens)
            self.span.end()

    async def collect(self, streams: list[AsyncIterator[worker_pb2.GenerateChunk]]) -> list[ChoiceResult]:
        try:
            results = await asyncio.gather(*(self._collect_one(s) for s in streams))
        finally:
            await self.close()
        return list(results)

    async def _collect_one(self, stream: AsyncIterator[worker_pb2.GenerateChunk]) -> ChoiceResult:
        return await collect_choice(stream, self.account)

    async def merged(self, streams: list[AsyncIterator[worker_pb2.GenerateChunk]]
                     ) -> AsyncIterator[tuple[int, worker_pb2.GenerateChunk]]:
        """(choice index, chunk) in arrival order; records inter-token latency."""
        itl = self.service.metrics.itl.labels(self.model)
        if len(streams) == 1:  # the common case: no pump task, no queue, no task switch per chunk
            last = time.monotonic()
            async for c in streams[0]:
                now = time.monotonic()
                itl.observe(now - last)
                last = now
                self.account(c)
                yield 0, c
            return
        last = time.monotonic()
        async with contextlib.aclosing(merge_streams(streams)) as merged:
            async for i, item in merged:
                now = time.monotonic()
                itl.observe(now - last)
                last = now
                self.account(item)
                yield i, item


T = TypeVar("T")


class ClientGone(GatewayError):
    def __init__(self) -> None:
        super().__init__(499, "the client closed the request", code="client_closed_request")


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
        raise ClientGone()
    return task.result()


def request_id() -> str:
    return secrets.token_hex(12)
