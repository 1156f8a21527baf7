"""Workers joining and staying: signed heartbeats into the registry, the attestation check before a
worker is routed to, the load and KV gauges, and the attestation documents the gateway serves
(/.well-known/attestation, the console)."""

from __future__ import annotations

import logging
from typing import Any

from api.gateway.demand import Demand
from api.gateway.errors import GatewayError
from api.gateway.metrics import Metrics
from api.gateway.registry import WorkerInfo, WorkerRegistry
from api.gateway.worker_attestation import verify_worker_attestation
from api.store.repo import KeyRecord
from attestation.errors import AttestationError
from attestation.token import TokenVerifier
from protocol.heartbeat import HeartbeatRefused, verify_heartbeat_signature

log = logging.getLogger(__name__)


class Enrolment:
    def __init__(self, registry: WorkerRegistry, verifier: TokenVerifier | None, demand: Demand,
                 metrics: Metrics) -> None:
        self.registry, self.verifier, self.demand, self.metrics = registry, verifier, demand, metrics

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
        if self.verifier is not None and info.status == "ready" and not info.attested:
            try:
                verify_worker_attestation(info.attestation_doc, info.ref, tls_cert=info.tls_cert,
                                          usage_public_key=info.usage_public_key, verifier=self.verifier,
                                          sealed_key_id=info.sealed_key_id)
                info.attested = True
            except (AttestationError, ValueError, KeyError) as exc:
                log.warning("worker %s not routed to: attestation check failed (%s)", info.worker_id,
                            type(exc).__name__)
        self.demand.set_queue(info.ref, float(sum(w.load() for w in self.registry.for_version(info.ref))))
        stats = info.stats
        if "kv_cache_usage_perc" in stats:
            self.metrics.kv_cache.labels(info.worker_id, info.model).set(float(stats["kv_cache_usage_perc"]) / 100)
            self.metrics.worker_waiting.labels(info.worker_id, info.model).set(float(stats.get("num_waiting", 0)))

    async def attestation(self, key: KeyRecord) -> list[dict[str, Any]]:
        """Each live worker's attestation document, exactly as the worker submitted it in its signed
        heartbeats and (with a broker JWKS configured) as the gateway verified it. Nothing is fetched
        from an address a worker supplies. Only the key's tenant's workers (and model scope)."""
        return [self._entry(w) for w in list(self.registry.workers.values())
                if self.registry.alive(w) and w.tenant == key.tenant and (not key.models or w.model in key.models)]

    async def attestation_all(self) -> list[dict[str, Any]]:
        """Every live worker's document, for callers that scope by their own authorization (the console)."""
        return [self._entry(w) for w in list(self.registry.workers.values()) if self.registry.alive(w)]

    def _entry(self, w: WorkerInfo) -> dict[str, Any]:
        entry: dict[str, Any] = {"worker_id": w.worker_id, "model": w.model, "version": w.version,
                                 "tenant": w.tenant, "usage_public_key": w.usage_public_key,
                                 "grpc_tls_cert": w.tls_cert or None}
        doc = w.attestation_doc
        if doc and (w.attested or self.verifier is None):
            entry.update({k: doc[k] for k in ("tee", "insecure", "evidence", "token", "model_digest",
                                              "sealed_key_id", "promises", "release") if k in doc})
        else:
            entry["status"] = "unavailable"
        return entry
