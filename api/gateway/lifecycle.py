"""One request's lifecycle in the gateway, the same for every surface (chat, completions, responses,
and their sealed forms): admit -> route -> relay -> settle -> audit, under its `gateway.request` span.

- admit: `begin` charges the ticket (budgets, rates: refused and audited by tickets.py), then
  `start` waits for a dispatch slot (a queue refusal is audited here) in `gateway.admission`;
- route and relay: each choice's stream (`GatewayService.stream`, or `sealed_stream` for the pinned
  worker) picks its worker in `gateway.route` and relays through the service's one `_relay`, which
  meters the signed usage and audits what the trailers carry;
- settle: `settle` closes the streams, gives the unused part of the reserve back, records the
  timing and ends the span, once, however the request ends (answered, refused, client gone).

Everything up to each choice's first chunk happens before the HTTP response starts, so refusals,
unavailable models and invalid prompts come back as proper status codes, not mid-stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any, TypeVar

from api.gateway.admission import Ticket
from api.gateway.errors import GatewayError
from api.gateway.priority_loop import mark_urgent
from api.gateway.service import GatewayService
from api.gateway.spans import request_span
from api.store.repo import KeyRecord
from protocol.openai.runner import ChoiceResult, collect_choice, merge_streams
from protocol.rpc import worker_pb2
from protocol.tracing import Span

Chunk = TypeVar("Chunk", worker_pb2.GenerateChunk, worker_pb2.SealedChunk)


class RequestLifecycle:
    def __init__(self, service: GatewayService, key: KeyRecord, model: str, ticket: Ticket, span: Span) -> None:
        self.service, self.key, self.model, self.ticket, self.span = service, key, model, ticket, span
        # A request of a tenant with little in flight runs ahead of the others in each loop turn
        # (priority_loop.py). Marked here, in the request's own task, before start() and the
        # relaying run in tasks of their own, which take this mark with them.
        mark_urgent(service.admission.light(ticket.tenant, ticket.streams))
        self.started = time.monotonic()
        self._stack = contextlib.AsyncExitStack()
        self.prompt_tokens = self.completion_tokens = 0
        self._settled = False

    @classmethod
    def begin(cls, service: GatewayService, headers: Any, key: KeyRecord, model: str, *, request_id: str,
              reserved_tokens: int, priority: int | None = None, streams: int = 1, sealed: bool = False,
              stream: bool = True, body_bytes: int | None = None) -> RequestLifecycle:
        """Admission's first step, the ticket (the worst case charged before any stream opens), then the
        request's span: only ids, sizes and counts the gateway already handles (spans.py)."""
        ticket = service.admissions.ticket(key, reserved_tokens, priority, streams=streams)
        span = request_span(service.tracing, headers, request_id=request_id, tenant=key.tenant, model=model,
                            sealed=sealed, choices=streams, stream=stream, body_bytes=body_bytes)
        return cls(service, key, model, ticket, span)

    async def admit(self) -> None:
        """Wait, in weighted fair order, for a dispatch slot, held until `settle`."""
        waiting = self.service.tracing.start("gateway.admission", self.span.context)
        try:
            await self._stack.enter_async_context(self.service.admission.slot(self.ticket))
        except GatewayError as exc:
            waiting.end(error=exc.code or "refused")
            self.service.admissions.audit_refusal(self.key, "queue", exc)
            raise
        waiting.end()

    async def start(self, streams: list[AsyncGenerator[Chunk, None]]) -> list[AsyncIterator[Chunk]]:
        """Admit, then open every stream (each routes and relays itself) and read its first chunk."""
        try:
            await self.admit()
            for s in streams:
                self._stack.push_async_callback(s.aclose)
            firsts = await asyncio.gather(*(anext(s) for s in streams))
        except BaseException:
            await self.settle(error="failed")
            raise
        elapsed = time.monotonic() - self.started
        self.service.metrics.ttft.labels(self.model).observe(elapsed)
        self.service.demand.ttft(self.key.tenant, self.model, elapsed)
        return [_prepend(f, s) for f, s in zip(firsts, streams, strict=True)]

    def count(self, prompt_tokens: int, completion_tokens: int) -> None:
        """Tokens a choice used (its final chunk's, or a sealed call's signed usage): settled against the reserve."""
        self.prompt_tokens += prompt_tokens
        self.completion_tokens += completion_tokens

    def account(self, chunk: worker_pb2.GenerateChunk) -> None:
        if chunk.finish_reason:
            self.count(chunk.prompt_tokens, chunk.completion_tokens)
            self.service.metrics.requests.labels(self.key.tenant, chunk.finish_reason).inc()

    async def settle(self, error: str = "") -> None:
        """Close the streams and the slot, give back the unused reserve, record the timing, end the span."""
        if self._settled:
            return
        self._settled = True
        try:
            await self._stack.aclose()
        finally:
            self.service.admission.settle(self.ticket, self.prompt_tokens + self.completion_tokens)
            self.service.metrics.e2e.labels(self.model).observe(time.monotonic() - self.started)
            if self.service.tracing.enabled:
                self.span.set("gen_ai.usage.input_tokens", self.prompt_tokens)
                self.span.set("gen_ai.usage.output_tokens", self.completion_tokens)
            self.span.end(error=error)

    # The OpenAI layer's ChoiceRunner (protocol/openai/runner.py): collect, merged, close.
    async def close(self) -> None:
        await self.settle()

    async def collect(self, streams: list[AsyncIterator[worker_pb2.GenerateChunk]]) -> list[ChoiceResult]:
        try:
            return list(await asyncio.gather(*(collect_choice(s, self.account) for s in streams)))
        finally:
            await self.settle()

    async def merged(self, streams: list[AsyncIterator[worker_pb2.GenerateChunk]]
                     ) -> AsyncIterator[tuple[int, worker_pb2.GenerateChunk]]:
        """(choice index, chunk) in arrival order; records inter-token latency."""
        itl, last = self.service.metrics.itl.labels(self.model), time.monotonic()
        async with contextlib.aclosing(merge_streams(streams)) as merged:
            async for i, chunk in merged:
                now = time.monotonic()
                itl.observe(now - last)
                last = now
                self.account(chunk)
                yield i, chunk


async def _prepend(first: Chunk, rest: AsyncIterator[Chunk]) -> AsyncIterator[Chunk]:
    """A stream with its first chunk (read to start it) put back in front."""
    yield first
    async for chunk in rest:  # read to the end even after the last token: metering happens there
        yield chunk
