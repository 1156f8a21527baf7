"""Gateway logic: keys -> tenant, catalog and rollouts, admission, routing, streaming, metering.

The gateway is outside the trust boundary: it never sees weights or keys, and never logs content.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from api.gateway.admission import AdmissionController, Ticket
from api.gateway.audit import admin_meta, audit_worker_decisions, open_gateway_audit
from api.gateway.demand import Demand
from api.gateway.edge_audit import EdgeAudit
from api.gateway.errors import GatewayError
from api.gateway.grpc_client import WorkerClients, WorkerLost, WorkerUnavailable, open_sealed
from api.gateway.metrics import EngineMetrics, Metrics
from api.gateway.registry import WorkerInfo, WorkerRegistry, reattest_required
from api.gateway.settings import GatewaySettings
from api.gateway.usage import UsageRejected, verify_usage
from api.gateway.usage_writer import UsageWriter
from api.gateway.worker_attestation import (
    HeartbeatRefused,
    load_verifier,
    verify_heartbeat_signature,
    verify_worker_attestation,
)
from api.store.models import Tenant
from api.store.repo import KeyRecord, Store, hash_secret
from attestation.errors import AttestationError
from policy.audit import AuditLog
from protocol.rpc import worker_pb2
from protocol.tls import load_or_create

log = logging.getLogger(__name__)
CACHE_S = 1.0


def not_found(model: str) -> GatewayError:
    # Same answer whether the model exists for another tenant or not at all.
    return GatewayError(404, f"The model `{model}` does not exist or you do not have access to it.",
                        code="model_not_found", param="model")


class GatewayService:
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
        self.clients = WorkerClients(load_or_create(settings.data_dir / "gateway-client.key",
                                                    settings.data_dir / "gateway-client.pem"))
        self.metrics = Metrics(lambda: float(admission.running), lambda: float(len(admission.queue)))
        # vLLM workers' engine metrics, under vLLM's names (docs/vllm-backend.md).
        self.metrics.registry.register(EngineMetrics(lambda: self.registry.workers.values()))
        self.demand = Demand(self.metrics.registry)
        self.usage_writer = UsageWriter(store)
        self.edge_audit = EdgeAudit(self.audit)  # 401/403/404/405/413/schema refusals, aggregated
        self._cache: dict[tuple, tuple[float, Any]] = {}
        self._probing: set[str] = set()
        self._tasks: set[asyncio.Task] = set()

    async def close(self) -> None:
        await self.registry.clock.stop()
        self.registry.executor.shutdown(wait=False)
        await self.usage_writer.close()
        self.edge_audit.flush()
        await self.clients.close()
        self.audit.close()

    def audit_refusal(self, key: KeyRecord, kind: str, exc: GatewayError) -> None:
        """An admission refusal (rate, tokens per minute, budget, queue) in the audit trail."""
        self.audit.append(tenant=key.tenant, action="admission", decision="deny", reason=f"{kind}: {exc.code}",
                          metadata={"key_id": key.key_id, "status": exc.status, "limit": kind})

    def audit_admin(self, who: Any, tenant: str, action: str, **meta: Any) -> None:
        """A management action (tenants, keys, models, policies, kill switch) by a principal."""
        self.audit.append(tenant=tenant or "-", action=action, decision="allow", reason="management",
                          metadata=admin_meta(principal=getattr(who, "subject", None) or getattr(who, "sub", None),
                                              role=getattr(who, "role", None), **meta))

    def forget(self) -> None:
        """Drop cached catalog and tenant rows (after a management change; other replicas: within CACHE_S)."""
        self._cache.clear()

    def _cached(self, key: tuple, compute):  # type: ignore[no-untyped-def]
        hit = self._cache.get(key)
        if hit and time.monotonic() - hit[0] < CACHE_S:
            return hit[1]
        value = compute()
        self._cache[key] = (time.monotonic(), value)
        return value

    # -- keys and catalog
    def bootstrap_keys(self) -> None:
        """Import hashes from the bootstrap file (`api-keys.json`, written by `sealed up`'s preparation)."""
        path = self.settings.data_dir / "api-keys.json"
        if not path.exists():
            return
        for key_hash, doc in json.loads(path.read_text()).items():
            expires = dt.datetime.fromisoformat(doc["expires_at"]) if doc.get("expires_at") else None
            self.store.import_key_hash(key_hash, doc["tenant"], doc["name"], tuple(doc.get("models", ())), expires)

    def cached_key(self, secret: str) -> KeyRecord | None:
        """A key this replica looked up within CACHE_S (no database, no thread hop); None: look it up.
        Only a single gateway caches keys (its management API forgets them on every change); with
        a shared database, another replica may revoke a key or set its kill switch, which must hold
        for the next request here too."""
        if self.settings.database_url:
            return None
        hit = self._cache.get(("key", hash_secret(secret)))
        if hit and time.monotonic() - hit[0] < CACHE_S and not hit[1].expired(dt.datetime.now(dt.UTC)):
            return hit[1]
        return None

    def authenticate(self, secret: str) -> KeyRecord:
        key = self.store.lookup_key(secret)
        if key is None:
            self.bootstrap_keys()
            key = self.store.lookup_key(secret)
        if key is None or key.expired(dt.datetime.now(dt.UTC)):
            raise GatewayError(401, "Incorrect API key provided.", code="invalid_api_key")
        self._cache[("key", hash_secret(secret))] = (time.monotonic(), key)
        return key

    def split(self, tenant: str, model: str) -> dict[str, float]:
        return self._cached(("split", tenant, model), lambda: {
            v.version: v.traffic_percent for v in self.store.model_versions(tenant) if v.model == model})

    def models_for(self, key: KeyRecord) -> list[str]:
        """Models a request can be answered for now: a ready (and, where required, attested) worker
        holds them. A model in the catalog whose workers are still loading is not listed yet."""
        names = {w.model for w in self.registry.workers.values() if w.tenant == key.tenant}
        return sorted(n for n in names if (not key.models or n in key.models) and self.registry.ready(key.tenant, n))

    def resolve(self, key: KeyRecord, model: str) -> dict[str, float]:
        if key.models and model not in key.models:
            raise not_found(model)
        split = self.split(key.tenant, model)
        if not split and not self.registry.for_model(key.tenant, model):
            raise not_found(model)
        return split

    # -- admission
    def tenant(self, name: str) -> Tenant | None:
        return self._cached(("tenant", name), lambda: self.store.tenant(name))

    def ticket(self, key: KeyRecord, reserved_tokens: int, priority: int | None = None, streams: int = 1) -> Ticket:
        t = self.tenant(key.tenant)
        budgets = ((t.token_budget if t else None, ("used", key.tenant), None),
                   (key.token_budget, ("used", key.tenant, key.key_id), key.key_id))
        for budget, cache_key, key_id in budgets:
            if budget is None:
                continue
            if reserved_tokens > budget:  # can never fit: refused (and audited) like any other admission refusal
                too_large = GatewayError(400, f"Request too large: it may use up to {reserved_tokens} tokens, more "
                                         f"than the whole token budget of {budget}"
                                         + (" of this key." if key_id else "."), code="request_too_large")
                self.audit_refusal(key, "key-budget" if key_id else "tenant-budget", too_large)
                raise too_large
            used = self._cached(cache_key, lambda k=key_id: self.store.tokens_used(key.tenant, k))
            if used >= budget:
                self.metrics.rejected.labels(key.tenant, "budget").inc()
                error = GatewayError(429, "You exceeded your token budget" + (" for this key." if key_id else "."),
                                     type_="insufficient_quota", code="insufficient_quota")
                self.audit_refusal(key, "key-budget" if key_id else "tenant-budget", error)
                raise error
        ticket = Ticket(tenant=key.tenant, key_id=key.key_id, weight=t.weight if t else 1.0,
                        # A request may lower its priority, never raise it above its key's.
                        priority=key.priority if priority is None else min(priority, key.priority),
                        reserved_tokens=reserved_tokens,
                        tenant_rpm=t.rpm if t else None, key_rpm=key.rpm, tenant_tpm=t.tpm if t else None,
                        key_tpm=key.tpm, max_queued=(t.max_queued if t and t.max_queued else
                                                     self.settings.max_queued), streams=streams)
        try:
            self.admission.check_limits(ticket)
        except GatewayError as exc:
            self.metrics.rejected.labels(key.tenant, "rate").inc()
            self.audit_refusal(key, "rate", exc)
            raise
        return ticket

    # -- generation
    async def stream(self, key: KeyRecord, model: str, split: dict[str, float],
                     request: worker_pb2.GenerateRequest, affinity: str) -> AsyncIterator[worker_pb2.GenerateChunk]:
        """One choice: pick a worker (another one if it cannot take the call), relay, meter.

        No request's error takes a worker out of rotation: an unreachable one is only skipped for this
        request and probed (its Status RPC); heartbeats and that probe decide whether it is dead.
        """
        tried: set[str] = set()
        while True:
            try:
                worker = self.registry.pick(key.tenant, model, split, affinity, frozenset(tried))
            except GatewayError:
                self.demand.unserved(key.tenant, model)  # wakes a version scaled to zero
                raise
            worker.inflight += 1
            try:
                first, rest = await self.clients.open(worker.grpc_address, request, self.settings.request_timeout_s,
                                                      worker.tls_cert)
                break
            except WorkerUnavailable:
                worker.inflight -= 1
                tried.add(worker.worker_id)
                self._probe_soon(worker)
            except GatewayError as exc:
                worker.inflight -= 1
                if getattr(exc, "worker_decisions", ()):  # the worker's signed refusal: verified, then audited
                    audit_worker_decisions(self.audit, exc.worker_decisions, pinned_key_hex=worker.usage_public_key,
                                           request_id=request.request_id, tenant=request.tenant,
                                           worker_id=worker.worker_id)
                raise
            except BaseException:
                worker.inflight -= 1
                raise
        try:
            chunk = first
            yield first
            async for chunk in rest:
                yield chunk
            if chunk.HasField("usage"):
                await self._meter(chunk.usage, worker, request)
            decisions = getattr(rest, "decisions", ())
            if decisions:
                audit_worker_decisions(self.audit, list(decisions), pinned_key_hex=worker.usage_public_key,
                                       request_id=request.request_id, tenant=request.tenant,
                                       worker_id=worker.worker_id)
        except WorkerLost:
            log.warning("worker %s lost mid-stream", worker.worker_id)
            self._probe_soon(worker)
            raise
        finally:
            worker.inflight -= 1

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

    # -- sealed mode (docs/sealed-mode.md): the gateway relays ciphertext and meters signed usage
    def require_sealed(self, tenant: str) -> bool:
        """The tenant's policy says `require_sealed` (its worker enforces the signed original too)."""
        row = self._cached(("policy", tenant), lambda: self.store.policy(tenant))
        doc = row.document if row is not None else None
        payload = doc.get("payload", doc) if isinstance(doc, dict) else None
        return isinstance(payload, dict) and payload.get("require_sealed") is True

    def check_plaintext_allowed(self, key: KeyRecord) -> None:
        if self.require_sealed(key.tenant):
            self.metrics.rejected.labels(key.tenant, "sealed_required").inc()
            raise GatewayError(403, "this tenant accepts only sealed requests: use SealedOpenAI or `sealed proxy` "
                               "(docs/sealed-mode.md)", code="sealed_required")

    async def sealed_stream(self, key: KeyRecord, model: str, request: worker_pb2.SealedRequest
                            ) -> AsyncIterator[worker_pb2.SealedChunk]:
        """Relay one sealed exchange with the pinned worker; never another one."""
        worker = self.registry.pinned(key.tenant, model, request.worker_key_id)
        worker.inflight += 1
        try:
            first, rest = await open_sealed(self.clients, worker.grpc_address, request,
                                            self.settings.request_timeout_s, worker.tls_cert)
        except GatewayError as exc:
            worker.inflight -= 1
            if isinstance(exc, WorkerUnavailable):
                self._probe_soon(worker)  # health checks, not one request, take a worker out of rotation
                raise reattest_required() from exc
            raise
        try:
            chunk = first
            yield first
            async for chunk in rest:
                yield chunk
            if chunk.HasField("usage"):
                await self._meter(chunk.usage, worker, request)
            decisions = getattr(rest, "decisions", ())
            if decisions:  # the worker's signed in-enclave decisions (no content): verified, then audited
                audit_worker_decisions(self.audit, list(decisions), pinned_key_hex=worker.usage_public_key,
                                       request_id=request.request_id, tenant=request.tenant,
                                       worker_id=worker.worker_id, sealed=True)
        except WorkerLost:
            log.warning("worker %s lost mid-stream", worker.worker_id)
            self._probe_soon(worker)
            raise
        finally:
            worker.inflight -= 1

    async def _meter(self, record: worker_pb2.UsageRecord, worker: WorkerInfo,
                     request: worker_pb2.GenerateRequest | worker_pb2.SealedRequest) -> None:
        try:
            row = verify_usage(record, worker, request.request_id, request.tenant)
        except UsageRejected as exc:
            log.error("usage record refused from worker %s: %s", worker.worker_id, exc)
            return
        self.metrics.prompt_tokens.labels(row.tenant, row.model).inc(row.prompt_tokens)
        self.metrics.generation_tokens.labels(row.tenant, row.model).inc(row.completion_tokens)
        self.metrics.worker_seconds.labels(row.tenant).inc(row.worker_seconds)
        await self.usage_writer.record(row)  # group commit, durable before the stream ends

    def heartbeat(self, doc: dict[str, Any], signed: dict[str, Any], seen_at: float | None = None) -> None:
        """A worker's heartbeat: `signed` is the body as sent, `doc` the same after validation,
        `seen_at` its arrival on the registry's clock."""
        try:
            verify_heartbeat_signature(signed)
        except HeartbeatRefused as exc:
            log.warning("heartbeat refused: %s", exc)
            raise GatewayError(401, "heartbeat is not signed by the worker's identity key",
                               code="invalid_worker_signature") from exc
        info = self.registry.heartbeat(doc, seen_at)
        if self._verifier is not None and info.status == "ready" and not info.attested:
            try:
                verify_worker_attestation(info.attestation_doc, info.ref, tls_cert=info.tls_cert,
                                          usage_public_key=info.usage_public_key, verifier=self._verifier,
                                          sealed_key_id=info.sealed_key_id)
                info.attested = True
            except (AttestationError, ValueError, KeyError) as exc:
                log.warning("worker %s not routed to: attestation check failed (%s)", info.worker_id,
                            type(exc).__name__)
        pool = [w for w in self.registry.for_model(info.tenant, info.model) if w.version == info.version]
        self.demand.set_queue(info.tenant, info.model, info.version, float(sum(w.load() for w in pool)))
        stats = info.stats
        if "kv_cache_usage_perc" in stats:
            self.metrics.kv_cache.labels(info.worker_id, info.model).set(float(stats["kv_cache_usage_perc"]) / 100)
            self.metrics.worker_waiting.labels(info.worker_id, info.model).set(float(stats.get("num_waiting", 0)))

    async def attestation(self, key: KeyRecord) -> list[dict[str, Any]]:
        """Each live worker's attestation document, exactly as the worker submitted it in its signed
        heartbeats and (with a broker JWKS configured) as the gateway verified it. Nothing is fetched
        from an address a worker supplies. Only the key's tenant's workers (and model scope)."""
        return [self._attestation_entry(w) for w in list(self.registry.workers.values())
                if self.registry.alive(w) and w.tenant == key.tenant and (not key.models or w.model in key.models)]

    async def attestation_all(self) -> list[dict[str, Any]]:
        """Every live worker's document, for callers that scope by their own authorization (the console)."""
        return [self._attestation_entry(w) for w in list(self.registry.workers.values()) if self.registry.alive(w)]

    def _attestation_entry(self, w: WorkerInfo) -> dict[str, Any]:
        entry: dict[str, Any] = {"worker_id": w.worker_id, "model": w.model, "version": w.version,
                                 "tenant": w.tenant, "usage_public_key": w.usage_public_key,
                                 "grpc_tls_cert": w.tls_cert or None}
        doc = w.attestation_doc
        if doc and (w.attested or self._verifier is None):
            entry.update({k: doc[k] for k in ("tee", "insecure", "evidence", "token", "model_digest",
                                              "sealed_key_id", "promises") if k in doc})
        else:
            entry["status"] = "unavailable"
        return entry
