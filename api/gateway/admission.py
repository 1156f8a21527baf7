"""Admission: rate limits, token budgets, bounded fair queue, then a dispatch slot.

Order of checks, cheapest first: per-tenant and per-key RPM, per-tenant and per-key TPM (the worst
case, prompt estimate + max tokens, is reserved and the unused part given back), lifetime token
budget, then the queue bound. Only then does the request wait, in weighted fair order, for one of
`max_inflight` dispatch slots.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass

from api.gateway.errors import GatewayError
from api.gateway.fairqueue import FairQueue, FairScheduler, QueueFull
from api.gateway.limits import QueueCounter
from policy.limiter import TokenBucketLimiter


@dataclass(frozen=True)
class Ticket:
    tenant: str
    key_id: str
    weight: float
    priority: int
    reserved_tokens: int
    tenant_rpm: int | None
    key_rpm: int | None
    tenant_tpm: int | None
    key_tpm: int | None
    max_queued: int
    streams: int = 1  # prompts x n: the dispatch slots this request takes


def rate_limited(message: str, retry_after: int, code: str = "rate_limit_exceeded") -> GatewayError:
    return GatewayError(429, message, type_="rate_limit_error" if code != "insufficient_quota" else
                        "insufficient_quota", code=code, headers={"Retry-After": str(retry_after)})


class AdmissionController:
    def __init__(self, limiter: TokenBucketLimiter, counter: QueueCounter, max_inflight: int,
                 max_queued: int, reserved: int | None = None, max_request_streams: int = 64) -> None:
        self.limiter = limiter
        self.counter = counter
        self.max_inflight = max_inflight
        self.queue = FairQueue(max_queued=max_queued, max_queued_per_tenant=max_queued)
        if reserved is None:
            # An eighth of the slots, and more than one request's overshoot (up to its streams - 1),
            # within half of them: a 64-stream request that starts on the last shared slot leaves
            # part of the reserve for tenants with little in flight.
            reserved = max(1, max_inflight // 8, min(max_inflight // 2, max_request_streams + 8))
        self.scheduler = FairScheduler(max_inflight, reserved, self.queue)

    @property
    def running(self) -> int:
        return self.scheduler.total_running

    def light(self, tenant: str, streams: int = 1) -> bool:
        """Would the tenant, with `streams` more, still hold few slots (the reserve's rule, fairqueue.py)?"""
        return self.scheduler.running[tenant] + streams <= self.scheduler.small

    def own_limit_refusal(self, tenant: str, key_id: str, tenant_rpm: int | None, key_rpm: int | None,
                          max_queued: int) -> GatewayError | None:
        """The 429 that check_limits or slot() would answer now for the key's own request rate or its
        tenant's queue bound, else None. Only peeks: charges nothing (a refused take charges nothing
        either), so a request let through is charged once, by check_limits and slot()."""
        for scope, rpm in ((f"rpm:t:{tenant}", tenant_rpm), (f"rpm:k:{key_id}", key_rpm)):
            if rpm is not None and self.limiter.available(scope, TokenBucketLimiter.per_minute(rpm)) < 1:
                return rate_limited("Rate limit reached for requests per minute.", max(1, int(60 / rpm) + 1))
        if self.counter.full(tenant, max_queued):
            return rate_limited("Too many queued requests for this tenant; retry later.", self._retry_after(),
                                code="queue_full")
        return None

    def check_limits(self, t: Ticket) -> None:
        """Charge the request's whole worst case (prompt estimate + max_tokens x choices) before any
        stream opens; a request larger than a TPM limit could never run and is refused outright."""
        for scope, tpm in (("tenant", t.tenant_tpm), ("key", t.key_tpm)):
            if tpm is not None and t.reserved_tokens > tpm:
                raise GatewayError(400, f"Request too large: it may use up to {t.reserved_tokens} tokens, more than "
                                   f"this {scope}'s limit of {tpm} tokens per minute. Lower max_tokens, n or the "
                                   "number of prompts.", code="request_too_large")
        for scope, rpm in ((f"rpm:t:{t.tenant}", t.tenant_rpm), (f"rpm:k:{t.key_id}", t.key_rpm)):
            if rpm is not None and not self.limiter.try_acquire(scope, TokenBucketLimiter.per_minute(rpm)):
                raise rate_limited("Rate limit reached for requests per minute.", max(1, int(60 / rpm) + 1))
        taken: list[tuple[str, int]] = []
        for scope, tpm in ((f"tpm:t:{t.tenant}", t.tenant_tpm), (f"tpm:k:{t.key_id}", t.key_tpm)):
            if tpm is None:
                continue
            if not self.limiter.try_acquire(scope, TokenBucketLimiter.per_minute(tpm), t.reserved_tokens):
                for s, limit in taken:
                    self.limiter.refund(s, TokenBucketLimiter.per_minute(limit), t.reserved_tokens)
                raise rate_limited("Rate limit reached for tokens per minute.", 60)
            taken.append((scope, tpm))

    def settle(self, t: Ticket, used_tokens: int) -> None:
        unused = max(0, t.reserved_tokens - used_tokens)
        for scope, tpm in ((f"tpm:t:{t.tenant}", t.tenant_tpm), (f"tpm:k:{t.key_id}", t.key_tpm)):
            if tpm is not None and unused:
                self.limiter.refund(scope, TokenBucketLimiter.per_minute(tpm), unused)

    def _retry_after(self) -> int:
        return max(1, min(60, len(self.queue) // max(1, self.max_inflight) + 1))

    def dispatch(self) -> None:
        """Start the queued requests that fit the free slots now (after a slot freed or the slots grew)."""
        while (got := self.scheduler.next()) is not None:
            tenant, (future, cost) = got
            if future.done():  # cancelled while queued
                self.scheduler.done(tenant, cost)
                continue
            future.set_result(None)

    @contextlib.asynccontextmanager
    async def slot(self, t: Ticket) -> AsyncIterator[None]:
        """Hold a dispatch slot for the duration of the request (including its stream)."""
        if not self.counter.enter(t.tenant, t.max_queued):
            raise rate_limited("Too many queued requests for this tenant; retry later.", self._retry_after(),
                                code="queue_full")
        try:
            future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            try:
                entry = self.queue.push(t.tenant, (future, t.streams), weight=t.weight, priority=t.priority,
                                        tenant_limit=t.max_queued, cost=t.streams)
            except QueueFull as exc:
                raise rate_limited(f"Server queue is full ({exc.scope}); retry later.", self._retry_after(),
                                    code="queue_full") from exc
            self.dispatch()
            try:
                await future
            except asyncio.CancelledError:
                if future.done() and not future.cancelled():
                    self.scheduler.done(t.tenant, t.streams)  # got the slot just as the client left
                    self.dispatch()
                else:
                    self.queue.cancel(entry)
                raise
            try:
                yield
            finally:
                self.scheduler.done(t.tenant, t.streams)
                self.dispatch()
        finally:
            self.counter.leave(t.tenant)
