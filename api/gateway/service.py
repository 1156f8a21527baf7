"""The gateway service: its parts wired together, and routing and streaming to workers.

The gateway is outside the trust boundary: it never sees weights or keys, and never logs content.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from typing import Any, TypeVar

from api.gateway.admission import AdmissionController
from api.gateway.audit import admin_meta, audit_worker_decisions, open_gateway_audit
from api.gateway.callers import check_plaintext_caller
from api.gateway.catalog import Catalog
from api.gateway.delivery_probe import DeliveryProbe
from api.gateway.demand import Demand
from api.gateway.enrolment import Enrolment
from api.gateway.errors import GatewayError
from api.gateway.grpc_client import WorkerClients, WorkerLost, WorkerRefusal, WorkerUnavailable, open_sealed
from api.gateway.metering import Metering
from api.gateway.metrics import EngineMetrics, Metrics
from api.gateway.registry import WorkerInfo, WorkerRegistry, reattest_required
from api.gateway.responses_store import StoredResponses
from api.gateway.settings import GatewaySettings
from api.gateway.settlement import Settlement
from api.gateway.spans import worker_call_span
from api.gateway.tickets import Admission
from api.gateway.usage_writer import UsageWriter
from api.gateway.worker_attestation import load_verifier
from api.store.repo import KeyRecord, Store
from policy.audit import AuditLog
from policy.audit.edge import EdgeRefusals
from policy.audit.stream.embedded import forwarding_from_env
from protocol.rpc import worker_pb2
from protocol.tls import load_or_create
from protocol.tracing import NULL_SPAN, Span, tracing_from_env
from protocol.worker_status import Settle

log = logging.getLogger(__name__)
CONSOLE_COMPONENT = "console"  # the console's audit log (api/console/router.py), in this process
Chunk = TypeVar("Chunk", worker_pb2.GenerateChunk, worker_pb2.SealedChunk)


class GatewayService:
    """The gateway's parts, wired: keys and catalog (`catalog`), admission (`admissions`), worker
    enrolment (`enrolment`), metering (`metering`); routing and streaming to workers are here.
    The routes call the service; the parts' entry points are bound onto it in __init__."""

    def __init__(self, settings: GatewaySettings, store: Store, admission: AdmissionController,
                 audit: AuditLog | None = None) -> None:
        self.settings = settings
        self.audit = audit or open_gateway_audit(settings)
        self.store = store
        self.admission = admission
        self.registry = WorkerRegistry(settings.heartbeat_timeout_s,
                                       require_attestation=settings.broker_jwks is not None)
        self._verifier = (load_verifier(settings.broker_jwks, settings.broker_issuer)
                          if settings.broker_jwks is not None else None)
        identity = load_or_create(settings.data_dir / "gateway-client.key", settings.data_dir / "gateway-client.pem")
        self.clients = WorkerClients(identity)
        # Its own channels (created on the loop that probes): gRPC's path in this process is shared.
        self.delivery_probe = DeliveryProbe(self.registry, WorkerClients(identity))  # started if slots adapt
        self.metrics = Metrics(lambda: float(admission.running), lambda: float(len(admission.queue)))
        # vLLM workers' engine metrics, under vLLM's names (docs/vllm-backend.md).
        self.metrics.registry.register(EngineMetrics(lambda: self.registry.workers.values()))
        self.demand = Demand(self.metrics.registry)
        self.usage_writer = UsageWriter(store)
        self.edge_audit = EdgeRefusals(self.audit)  # 401/403/404/405/413/schema refusals, aggregated
        self.catalog = Catalog(settings, store, self.registry)
        self.admissions = Admission(settings, self.catalog, admission, self.metrics, self.audit)
        self.enrolment = Enrolment(self.registry, self._verifier, self.demand, self.metrics)
        self.metering = Metering(self.metrics, self.usage_writer)
        self.settlement = Settlement(self.audit, self.metering)  # sealed records; usage owed by heartbeat
        self.responses = StoredResponses(store, self.audit)  # stored responses: ciphertext rows by id
        # The parts' entry points, as the routes call them.
        self.forget, self.bootstrap_keys = self.catalog.forget, self.catalog.bootstrap_keys
        self.cached_key, self.authenticate = self.catalog.cached_key, self.catalog.authenticate
        self.split, self.models_for, self.resolve = self.catalog.split, self.catalog.models_for, self.catalog.resolve
        self.tenant, self.require_sealed = self.catalog.tenant, self.catalog.require_sealed
        self.ticket, self.audit_refusal = self.admissions.ticket, self.admissions.audit_refusal
        self.heartbeat = self.enrolment.heartbeat
        self.attestation, self.attestation_all = self.enrolment.attestation, self.enrolment.attestation_all
        self._probing: set[str] = set()
        self._tasks: set[asyncio.Task] = set()
        self.tracing = tracing_from_env("gateway")  # NoTracing unless OTEL_* asks (docs/tracing.md)
        # This process's audit logs to the SIEM when SEALED_AUDIT_FORWARD names a config (docs/siem.md);
        # the console's log ("console", written in this process too) goes with the gateway's own.
        logs = {self.audit.component: self.audit.path.parent}
        if settings.console.audit_dir is not None:
            logs[CONSOLE_COMPONENT] = settings.console.audit_dir
        self.audit_forwarding = forwarding_from_env(logs)

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

    def audit_admin(self, who: Any, tenant: str, action: str, **meta: Any) -> None:
        """A management action (tenants, keys, models, policies, kill switch) by a principal."""
        self.audit.append(tenant=tenant or "-", action=action, decision="allow", reason="management",
                          metadata=admin_meta(principal=getattr(who, "subject", None) or getattr(who, "sub", None),
                                              role=getattr(who, "role", None), **meta))

    # -- routing and streaming
    async def stream(self, key: KeyRecord, model: str, split: dict[str, float],
                     request: worker_pb2.GenerateRequest, affinity: str, span: Span = NULL_SPAN
                     ) -> AsyncGenerator[worker_pb2.GenerateChunk, None]:
        """One choice: pick a worker (another one if it cannot take the call), relay, meter.

        No request's error takes a worker out of rotation: an unreachable one is only skipped for this
        request and probed (its Status RPC); heartbeats and that probe decide whether it is dead.
        """
        tried: set[str] = set()
        while True:
            routing = self.tracing.start("gateway.route", span.context)
            try:
                worker = self.registry.pick(key.tenant, model, split, affinity, frozenset(tried))
            except GatewayError as exc:
                routing.end(error=exc.code or "no_worker")
                self.demand.unserved(key.tenant, model)  # wakes a version scaled to zero
                raise
            if self.tracing.enabled:
                routing.set("sealed.worker_id", worker.worker_id)
                routing.set("sealed.attempts", len(tried) + 1)
            routing.end()
            worker.inflight += 1
            call, metadata = worker_call_span(self.tracing, span, "Generate", worker.worker_id)
            try:
                first, rest = await self.clients.open(worker.grpc_address, request, self.settings.request_timeout_s,
                                                      worker.tls_cert, metadata)
                break
            except WorkerUnavailable:
                call.end(error="worker_unavailable")
                worker.inflight -= 1
                tried.add(worker.worker_id)
                self._probe_soon(worker)
            except GatewayError as exc:
                call.end(error=exc.code or "worker_error")
                worker.inflight -= 1
                if isinstance(exc, WorkerRefusal) and exc.worker_decisions:  # signed: verified, then audited
                    audit_worker_decisions(self.audit, exc.worker_decisions, pinned_key_hex=worker.usage_public_key,
                                           request_id=request.request_id, tenant=request.tenant,
                                           worker_id=worker.worker_id)
                raise
            except BaseException:
                call.end(error="cancelled")
                worker.inflight -= 1
                raise
        # aclosing: a client that goes away closes this generator, and the relay with it, at once.
        async with aclosing(self._relay(worker, request, first, rest, sealed=False, call=call)) as relay:
            async for chunk in relay:
                yield chunk

    async def call(self, key: KeyRecord, model: str, split: dict[str, float], method: str, request: Any) -> Any:
        """A unary worker call for (tenant, model) on a ready worker; an unreachable one is skipped."""
        tried: set[str] = set()
        while True:
            worker = self.registry.pick(key.tenant, model, split, "", frozenset(tried))
            try:
                return await self.clients.unary(worker.grpc_address, worker.tls_cert, method, request, 30.0)
            except WorkerUnavailable:
                tried.add(worker.worker_id)
                self._probe_soon(worker)

    def _probe_soon(self, worker: WorkerInfo) -> None:
        """A health check (the worker's Status RPC), at most one at a time per worker."""
        if worker.worker_id in self._probing:
            return
        self._probing.add(worker.worker_id)
        task = asyncio.create_task(self._probe(worker))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _probe(self, worker: WorkerInfo) -> None:
        try:
            lag_before = self.registry.clock.stalled_s
            healthy = await self.clients.status_ok(worker.grpc_address, worker.tls_cert, timeout_s=2.0)
            if not healthy and self.registry.clock.stalled_s - lag_before > 0.5:
                # The gateway's own loop lagged through the probe: that says nothing about the worker.
                log.warning("health check of worker %s inconclusive (gateway loop lagging); heartbeats decide",
                            worker.worker_id)
            elif not healthy:
                log.warning("worker %s failed its health check; out of rotation until its next heartbeat",
                            worker.worker_id)
                self.registry.mark_dead(worker.worker_id)
        finally:
            self._probing.discard(worker.worker_id)

    def _audit_trailers(self, worker: WorkerInfo, request: worker_pb2.GenerateRequest | worker_pb2.SealedRequest,
                        rest: AsyncIterator[Any], sealed: bool) -> None:
        if sealed:  # never decisions in clear, whatever the worker sent: only the tenant's record
            record = getattr(rest, "sealed_record", None)
            if record is not None:
                self.settlement.sealed_record(worker, record, request.request_id)
            return
        decisions = getattr(rest, "decisions", ())
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
        if self.require_sealed(key.tenant):
            self.metrics.rejected.labels(key.tenant, "sealed_required").inc()
            raise GatewayError(403, "this tenant accepts only sealed requests: use SealedOpenAI or `sealed proxy` "
                               "(docs/sealed-mode.md)", code="sealed_required")

    async def sealed_stream(self, key: KeyRecord, model: str, request: worker_pb2.SealedRequest,
                            span: Span = NULL_SPAN) -> AsyncGenerator[worker_pb2.SealedChunk, None]:
        """Relay one sealed exchange with the pinned worker; never another one."""
        routing = self.tracing.start("gateway.route", span.context)
        try:
            worker = self.registry.pinned(key.tenant, model, request.worker_key_id)
        except GatewayError as exc:
            routing.end(error=exc.code or "no_worker")
            raise
        if self.tracing.enabled:
            routing.set("sealed.worker_id", worker.worker_id)
        routing.end()
        worker.inflight += 1
        call, metadata = worker_call_span(self.tracing, span, "SealedGenerate", worker.worker_id)
        try:
            first, rest = await open_sealed(self.clients, worker.grpc_address, request,
                                            self.settings.request_timeout_s, worker.tls_cert, metadata)
        except BaseException as exc:
            call.end(error=(exc.code if isinstance(exc, GatewayError) else "") or "failed")
            if not isinstance(exc, GatewayError):
                raise
            worker.inflight -= 1
            if isinstance(exc, WorkerUnavailable):
                self._probe_soon(worker)  # health checks, not one request, take a worker out of rotation
                raise reattest_required() from exc
            raise
        # aclosing: a client that goes away closes this generator, and the relay with it, at once.
        async with aclosing(self._relay(worker, request, first, rest, sealed=True, call=call)) as relay:
            async for chunk in relay:
                yield chunk

    async def _relay(self, worker: WorkerInfo, request: worker_pb2.GenerateRequest | worker_pb2.SealedRequest,
                     first: Chunk, rest: AsyncIterator[Chunk], *, sealed: bool, call: Span = NULL_SPAN
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
            self._probe_soon(worker)
            raise
        finally:
            call.end(error=error)
            worker.inflight -= 1
            closing = getattr(rest, "aclose", None)
            if closing is not None:  # the client left: cancel the call now, not when it is collected
                await closing()
