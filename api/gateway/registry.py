"""Workers register by heartbeat; routing picks a healthy worker holding the model version.

Version: by the rollout's traffic split (among versions that have a healthy worker). Worker: the
least loaded, unless the prompt's prefix has an affinity worker (rendezvous hash) whose load is
within `affinity_slack` of the least, so repeated prefixes hit the same prefix cache.
"""

from __future__ import annotations

import hashlib
import random
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from api.gateway.errors import GatewayError
from api.gateway.liveness import LoopClock
from protocol.model_ref import ModelRef


@dataclass
class WorkerInfo:
    worker_id: str
    grpc_address: str
    ref: ModelRef  # the model version it serves (its heartbeat's names, validated at the route)
    status: str
    tee: str
    insecure: bool
    usage_public_key: str
    pid: int | None = None
    tls_cert: str = ""
    stats: dict[str, Any] = field(default_factory=dict)
    last_seen: float = 0.0  # on the registry's LoopClock (time the gateway was responsive)
    inflight: int = 0
    dead: bool = False
    attested: bool = False  # its attestation token binds tls_cert and usage_public_key
    sealed_key_id: str = ""  # hex SHA-256 of its attested HPKE key (sealed mode pins it)
    attestation_doc: dict[str, Any] | None = None  # as submitted (and, once attested, verified)
    seq: int = 0  # the last signed heartbeat's sequence number (replays are refused)
    reason: str = ""  # why a failed worker failed (a category, e.g. "key release refused")

    @property
    def tenant(self) -> str:
        return self.ref.tenant

    @property
    def model(self) -> str:
        return self.ref.model

    @property
    def version(self) -> str:
        return self.ref.version

    def load(self) -> float:
        return self.inflight + float(self.stats.get("num_waiting", 0))


def unavailable(detail: str = "") -> GatewayError:
    suffix = f" ({detail})" if detail else ""
    # Retryable: the control loop starts, restarts or wakes (from zero) the version's workers.
    return GatewayError(503, f"model unavailable: no attested worker is serving it{suffix}",
                        type_="model_unavailable", code="model_unavailable", headers={"Retry-After": "2"})


def reattest_required() -> GatewayError:
    return GatewayError(409, "the worker this request was sealed to is not serving; fetch "
                        "/.well-known/attestation, verify it and seal the request again",
                        code="reattest_required", param="Sealed-Key-Id")


class WorkerRegistry:
    def __init__(self, heartbeat_timeout_s: float = 3.0, affinity_slack: float = 2.0,
                 rng: random.Random | None = None, require_attestation: bool = False,
                 clock: LoopClock | None = None) -> None:
        self.workers: dict[str, WorkerInfo] = {}
        # Heartbeat age is measured on the gateway's loop-lag-adjusted clock (api/gateway/liveness.py):
        # a worker is never declared dead because the gateway was too busy to read its heartbeats.
        self.clock = clock or LoopClock()
        # Heartbeats are verified here, one at a time, not in the default executor (shared with
        # usage writes and key look-ups, whose queue grows under a flood).
        self.executor = ThreadPoolExecutor(1, thread_name_prefix="heartbeats")
        self.require_attestation = require_attestation
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.affinity_slack = affinity_slack
        self._rng = rng or random.Random()

    def heartbeat(self, doc: dict[str, Any], seen_at: float | None = None) -> WorkerInfo:
        """Register or refresh a worker; `seen_at` is when the heartbeat reached the gateway (on
        `self.clock`), so time spent waiting to be processed never ages it."""
        wid = str(doc["worker_id"])
        known = self.workers.get(wid)
        if known is not None and (known.usage_public_key, known.tls_cert) != (doc["usage_public_key"],
                                                                             doc.get("tls_cert", "")):
            # Pinned at first contact: a different process may not take over a worker's identity.
            raise GatewayError(409, "worker identity changed", type_="invalid_request_error")
        seq = int(doc.get("seq") or 0)
        if known is not None and seq <= known.seq:
            raise GatewayError(409, "stale or replayed heartbeat", type_="invalid_request_error")
        ref = ModelRef(doc["tenant"], doc["model"], doc["version"])
        info = known or WorkerInfo(worker_id=wid, grpc_address=doc["grpc_address"], ref=ref,
                                   status=doc["status"], tee=doc["tee"], insecure=bool(doc["insecure"]),
                                   usage_public_key=doc["usage_public_key"], pid=doc.get("pid"),
                                   tls_cert=doc.get("tls_cert", ""), sealed_key_id=str(doc.get("sealed_key_id", "")))
        if (info.grpc_address, info.ref, info.sealed_key_id) != (
                doc["grpc_address"], ref, str(doc.get("sealed_key_id", ""))):
            raise GatewayError(409, "worker identity changed", type_="invalid_request_error")
        attestation = doc.get("attestation")
        if attestation != info.attestation_doc:
            info.attestation_doc, info.attested = attestation, False  # checked again before routing
        info.seq = seq
        info.status, info.stats, info.reason = doc["status"], doc.get("stats") or {}, str(doc.get("reason") or "")
        info.last_seen, info.dead = max(info.last_seen, self.clock.now() if seen_at is None else seen_at), False
        if known is None:
            # A new process on an address another worker had: that one is gone (restarted in place).
            for other in self.workers.values():
                if other.grpc_address == info.grpc_address and other.worker_id != wid:
                    other.dead = True
        self.workers[wid] = info
        return info

    def alive(self, w: WorkerInfo) -> bool:
        return not w.dead and self.clock.now() - w.last_seen < self.heartbeat_timeout_s

    def heartbeat_age(self, w: WorkerInfo) -> float:
        return max(0.0, self.clock.now() - w.last_seen)

    def mark_dead(self, worker_id: str) -> None:
        if worker_id in self.workers:
            self.workers[worker_id].dead = True

    # A request names a tenant's model, and routing picks the version (`pick`): these look up by
    # (tenant, model). The control loop and the gauges count per version: by ModelRef.
    def for_model(self, tenant: str, model: str) -> list[WorkerInfo]:
        return [w for w in self.workers.values() if w.tenant == tenant and w.model == model and self.alive(w)]

    def ready(self, tenant: str, model: str) -> list[WorkerInfo]:
        return [w for w in self.for_model(tenant, model) if self.routable(w)]

    def routable(self, w: WorkerInfo) -> bool:
        return w.status == "ready" and (w.attested or not self.require_attestation)

    def for_version(self, ref: ModelRef) -> list[WorkerInfo]:
        """The live workers of one model version, whatever their state."""
        return [w for w in self.workers.values() if w.ref == ref and self.alive(w)]

    def pinned(self, tenant: str, model: str, sealed_key_id: str) -> WorkerInfo:
        """Sealed mode: the one worker whose key the client pinned, or a re-attest error (never
        another worker: a request sealed to one key opens nowhere else)."""
        for w in self.ready(tenant, model):
            if sealed_key_id and w.sealed_key_id == sealed_key_id:
                return w
        raise reattest_required()

    def pick(self, tenant: str, model: str, split: dict[str, float], affinity_key: str = "",
             exclude: frozenset[str] = frozenset()) -> WorkerInfo:
        ready = [w for w in self.ready(tenant, model) if w.worker_id not in exclude]
        if not ready:
            states = sorted({w.status for w in self.for_model(tenant, model)})
            raise unavailable(", ".join(states) or "no worker registered")
        versions = sorted({w.version for w in ready})
        weights = [max(0.0, split.get(v, 0.0)) for v in versions]
        if sum(weights) <= 0:
            # No split covers a live version (e.g. the promoted one has no worker yet): keep serving.
            weights = [1.0] * len(versions)
        version = self._rng.choices(versions, weights)[0]
        pool = [w for w in ready if w.version == version]
        least = min(pool, key=lambda w: (w.load(), w.worker_id))
        if affinity_key and len(pool) > 1:
            def score(w: WorkerInfo) -> bytes:
                return hashlib.sha256(f"{affinity_key}\0{w.worker_id}".encode()).digest()
            preferred = max(pool, key=score)
            if preferred.load() <= least.load() + self.affinity_slack:
                return preferred
        return least
