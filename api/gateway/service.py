"""The gateway service: its parts, and routing and streaming to workers.

The gateway is outside the trust boundary: it never sees weights or keys, and never logs content.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any, TypeVar

from api.gateway.admission import AdmissionController
from api.gateway.audit import audit_worker_decisions
from api.gateway.callers import check_plaintext_caller
from api.gateway.catalog import Catalog
from api.gateway.delivery_probe import DeliveryProbe
from api.gateway.demand import Demand
from api.gateway.enrolment import Enrolment
from api.gateway.errors import GatewayError
from api.gateway.grpc_client import (
    Health,
    SnapshotNeeded,
    WorkerClients,
    WorkerLost,
    WorkerRefusal,
    WorkerStream,
    WorkerUnavailable,
)
from api.gateway.metering import Metering
from api.gateway.metrics import Metrics
from api.gateway.registry import WorkerInfo, WorkerRegistry, reattest_required
from api.gateway.responses_store import StoredResponses
from api.gateway.settings import GatewaySettings
from api.gateway.settlement import Settlement
from api.gateway.spans import worker_call_span
from api.gateway.tickets import Admission
from api.gateway.usage_writer import UsageWriter
from api.store.repo import KeyRecord, Store
from policy.audit import AuditLog
from policy.audit.edge import EdgeRefusals
from policy.audit.stream.embedded import EmbeddedForwarding
from protocol.rpc import worker_pb2
from protocol.tracing import NULL_SPAN, Span, Tracing
from protocol.worker_status import Settle

log = logging.getLogger(__name__)
Chunk = TypeVar("Chunk", worker_pb2.GenerateChunk, worker_pb2.SealedChunk)
T = TypeVar("T")


@dataclass(eq=False)
class GatewayService:
    """The gateway's parts, built once by the composition root (`api.app.build_gateway`) and handed
    to the routes (dependencies.py); routing and relaying to workers, the part of each request's
    lifecycle (lifecycle.py) that talks to them, are here."""

    settings: GatewaySettings
    store: Store
    audit: AuditLog
    admission: AdmissionController  # rate limits, the fair queue and dispatch slots
    admissions: Admission  # tickets: budgets, and refusals counted and audited
    registry: WorkerRegistry
    catalog: Catalog  # keys, tenants, model versions and splits
    enrolment: Enrolment  # worker heartbeats and attestation
    clients: WorkerClients
    delivery_probe: DeliveryProbe  # started if slots adapt
    metrics: Metrics
    demand: Demand
    usage_writer: UsageWriter
    metering: Metering
    settlement: Settlement  # sealed records; usage owed by heartbeat
    edge_audit: EdgeRefusals  # 401/403/404/405/413/schema refusals, aggregated
    tracing: Tracing  # NoTracing unless OTEL_* asks (docs/tracing.md)
    audit_forwarding: EmbeddedForwarding | None  # to the SIEM when SEALED_AUDIT_FORWARD names a config (docs/siem.md)
    responses: StoredResponses  # stored responses and conversations: ciphertext rows by id
    probe_timeout_s: float = 2.0  # a health check's deadline
    _probing: set[str] = field(default_factory=set)
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    async def close(self) -> None:
        await self.registry.clock.stop()
        self.registry.executor.shutdown(wait=False)
        await self.usage_writer.close()
        self.edge_audit.flush()
        self.admissions.refusals.flush()  # the window's admission-summary entries
        await self.clients.close()
        if self.audit_forwarding is not None:
            self.audit_forwarding.stop()
        self.audit.close()
        self.tracing.shutdown()

    # -- routing and streaming: the route and relay steps of a request's lifecycle (lifecycle.py)
    async def stream(self, key: KeyRecord, model: str, split: dict[str, float],
                     request: worker_pb2.GenerateRequest, affinity: str, span: Span = NULL_SPAN
                     ) -> AsyncGenerator[worker_pb2.GenerateChunk, None]:
        """One choice: pick a worker (another one if it cannot take the call, `reachable`), relay, meter."""

        def pick(tried: frozenset[str]) -> WorkerInfo:
            try:
                return self._route(span, lambda: self.registry.pick(key.tenant, model, split, affinity, tried),
                                   attempts=len(tried) + 1)
            except GatewayError:
                self.demand.unserved(key.tenant, model)  # wakes a version scaled to zero
                raise

        async def open_on(worker: WorkerInfo) -> tuple[Any, Any, Span]:
            try:
                return await self._open(worker, "Generate", request, span)
            except WorkerRefusal as exc:
                self.audit_decisions(worker, exc.worker_decisions, request)
                raise

        worker, (first, rest, call) = await self.reachable(pick, open_on)
        # aclosing: a client that goes away closes this generator, and the relay with it, at once.
        async with aclosing(self._relay(worker, request, first, rest, sealed=False, call=call)) as relay:
            async for chunk in relay:
                yield chunk

    async def sealed_stream(self, key: KeyRecord, model: str, request: worker_pb2.SealedRequest,
                            span: Span = NULL_SPAN, missing: Callable[[WorkerInfo], Awaitable[None]] | None = None
                            ) -> AsyncGenerator[worker_pb2.SealedChunk, None]:
        """Relay one sealed exchange with the pinned worker; never another one. `missing`: what sends
        that worker the vector store snapshot a sealed search names when it answers that it lacks it
        (before the envelope opened), after which the same request is relayed once more."""
        worker = self._route(span, lambda: self.registry.pinned(key.tenant, model, request.worker_key_id))
        try:
            try:
                first, rest, call = await self._open(worker, "SealedGenerate", request, span)
            except SnapshotNeeded:
                if missing is None:
                    raise
                await missing(worker)
                first, rest, call = await self._open(worker, "SealedGenerate", request, span)
        except WorkerUnavailable as exc:
            self.probe_soon(worker)  # health checks, not one request, take a worker out of rotation
            raise reattest_required() from exc
        async with aclosing(self._relay(worker, request, first, rest, sealed=True, call=call)) as relay:
            async for chunk in relay:
                yield chunk

    def _route(self, span: Span, pick: Callable[[], WorkerInfo], attempts: int = 0) -> WorkerInfo:
        """The route step, in its `gateway.route` span."""
        routing = self.tracing.start("gateway.route", span.context)
        try:
            worker = pick()
        except GatewayError as exc:
            routing.end(error=exc.code or "no_worker")
            raise
        if self.tracing.enabled:
            routing.set("sealed.worker_id", worker.worker_id)
            if attempts:
                routing.set("sealed.attempts", attempts)
        routing.end()
        return worker

    async def _open(self, worker: WorkerInfo, method: str, request: Any, span: Span) -> tuple[Any, Any, Span]:
        """Open the call on `worker` (taking one of its in-flight slots, which the relay gives back), in
        its `gateway.worker_call` span: the first chunk, the rest, and the span."""
        worker.inflight += 1
        call, metadata = worker_call_span(self.tracing, span, method, worker.worker_id)
        try:
            first, rest = await self.clients.open(worker.grpc_address, request, self.settings.request_timeout_s,
                                                  worker.tls_cert, metadata)
        except BaseException as exc:
            call.end(error=exc.code or "worker_error" if isinstance(exc, GatewayError) else "cancelled")
            worker.inflight -= 1
            raise
        return first, rest, call

    async def call(self, key: KeyRecord, model: str, split: dict[str, float], method: str, request: Any) -> Any:
        """A unary worker call for (tenant, model) on a ready worker; an unreachable one is skipped."""
        _, reply = await self.reachable(
            lambda tried: self.registry.pick(key.tenant, model, split, "", tried),
            lambda worker: self.clients.unary(worker.grpc_address, worker.tls_cert, method, request, 30.0))
        return reply

    async def reachable(self, pick: Callable[[frozenset[str]], WorkerInfo],
                         attempt: Callable[[WorkerInfo], Awaitable[T]]) -> tuple[WorkerInfo, T]:
        """`attempt` on the worker `pick` chooses, else on another one while none could take the call.

        No request's error takes a worker out of rotation: an unreachable one is only skipped for this
        request and probed (its Status RPC); heartbeats and that probe decide whether it is dead.
        """
        tried: set[str] = set()
        while True:
            worker = pick(frozenset(tried))
            try:
                return worker, await attempt(worker)
            except WorkerUnavailable:
                tried.add(worker.worker_id)
                self.probe_soon(worker)

    def probe_soon(self, worker: WorkerInfo) -> None:
        """A health check (the worker's Status RPC), at most one at a time per worker."""
        if worker.worker_id in self._probing:
            return
        self._probing.add(worker.worker_id)
        task = asyncio.create_task(self._probe(worker))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _probe(self, worker: WorkerInfo) -> None:
        try:
            clock = self.registry.clock
            lag_before = clock.stalled_s
            health = await self.clients.health(worker.grpc_address, worker.tls_cert, timeout_s=self.probe_timeout_s)
            if health is Health.READY:
                return
            if clock.stalled_s - lag_before > 0.5 or (health is Health.SILENT and not clock.running):
                # The gateway's own loop lagged through the probe, or a silence it cannot tell from its
                # own stall (no ticker measures the loop): that says nothing about the worker.
                log.warning("health check of worker %s inconclusive (%s, gateway loop lagging or unmeasured); "
                            "heartbeats decide", worker.worker_id, health.value)
            else:
                log.warning("worker %s failed its health check (%s); out of rotation until its next heartbeat",
                            worker.worker_id, health.value)
                self.registry.mark_dead(worker.worker_id)
        finally:
            self._probing.discard(worker.worker_id)

    def _audit_trailers(self, worker: WorkerInfo, request: worker_pb2.GenerateRequest | worker_pb2.SealedRequest,
                        rest: WorkerStream, sealed: bool) -> None:
        """The audit step: what the call's trailers carry (plaintext: the worker's signed decisions,
        verified; sealed: never decisions in clear, whatever the worker sent, only the tenant's record)."""
        if not sealed:
            self.audit_decisions(worker, rest.decisions, request)
        elif rest.sealed_record is not None:
            self.settlement.sealed_record(worker, rest.sealed_record, request.request_id)

    def audit_decisions(self, worker: WorkerInfo, decisions: Sequence[worker_pb2.UsageRecord], request: Any) -> None:
        """A worker's signed in-enclave decisions (a refusal's, or a call's trailers): verified, then audited."""
        if decisions:
            audit_worker_decisions(self.audit, list(decisions), pinned_key_hex=worker.usage_public_key,
                                   request_id=request.request_id, tenant=request.tenant, worker_id=worker.worker_id)

    async def settle_owed(self, worker_id: str, settle: Settle) -> bool:
        """A heartbeat's batch of what calls that ended early owe (its signature checked with the
        beat's); False while the worker is not attested (it keeps the batch and sends it again)."""
        worker = self.registry.workers.get(worker_id)
        if worker is None or (self.registry.require_attestation and not worker.attested):
            return False
        await self.settlement.owed(worker, settle)
        return True

    def check_plaintext_allowed(self, key: KeyRecord) -> None:
        check_plaintext_caller(self.catalog.caller_policy(key.tenant), key.key_id)
        if self.catalog.require_sealed(key.tenant):
            self.metrics.rejected.labels(key.tenant, "sealed_required").inc()
            raise GatewayError(403, "this tenant accepts only sealed requests: use SealedOpenAI or `sealed proxy` "
                               "(docs/sealed-mode.md)", code="sealed_required")

    async def _relay(self, worker: WorkerInfo, request: worker_pb2.GenerateRequest | worker_pb2.SealedRequest,
                     first: Chunk, rest: WorkerStream, *, sealed: bool, call: Span = NULL_SPAN
                     ) -> AsyncGenerator[Chunk, None]:
        """Relay an opened stream (plain or sealed, the same way): chunks to the caller; the final
        chunk's usage to metering and what the trailers carry to the audit log (plaintext: the
        worker's signed decisions, verified; sealed: the tenant's opaque record), both settled
        before the final chunk is passed on, so a client that leaves then cannot cut them off; a
        worker lost mid-stream gets a health check. Releases the worker's in-flight slot the
        caller took, however the stream ends; ends the call's span (`call`)."""
        error = "cancelled"
        try:
            chunk: Chunk | None = first
            while chunk is not None and not chunk.HasField("usage"):
                yield chunk
                chunk = await anext(rest, None)
            if chunk is not None:  # the final chunk: read the call to its end (trailers) first
                async for _ in rest:
                    pass
                await self.metering.record(chunk.usage, worker, request)
            self._audit_trailers(worker, request, rest, sealed)
            if chunk is not None:
                yield chunk
            error = ""
        except WorkerLost:
            error = "worker_lost"
            log.warning("worker %s lost mid-stream", worker.worker_id)
            self.probe_soon(worker)
            raise
        finally:
            call.end(error=error)
            worker.inflight -= 1
            await rest.aclose()  # the client left: cancel the call now, not when it is collected
