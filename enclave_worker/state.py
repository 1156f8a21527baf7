"""What one worker process holds: `WorkerState`, built once at startup and frozen, and `LiveState`, the
small part that changes while it runs (serving status, the booted model, the key's lease).

The entry point (`enclave_worker/serve.py`) makes the keys, reads the tenant's signed policy set and
builds the state before anything serves; the boot (`enclave_worker/lifecycle.py`) then moves `live`
from "starting" to "ready" or "failed", and a revocation or a lease that runs out from "ready" to
"failed". Nothing else writes it: the gRPC service, the status app and the heartbeats only read.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from attestation.bundle import channel_binding
from enclave_worker.boot import BootedWorker
from enclave_worker.clock import Clock
from enclave_worker.cold_start import ColdStart
from enclave_worker.engine.embedding_engine import ComputeEncoder, EmbeddingEngine
from enclave_worker.guard import WorkerGuard
from enclave_worker.keywatch import KeyLease
from enclave_worker.outbox import Outbox
from enclave_worker.settings import WorkerSettings
from enclave_worker.signing import RequestSigner
from enclave_worker.tenant_records import TenantRecords
from enclave_worker.tool_syntax import syntax_for_template
from policy.audit.worker_record import public_key_bytes
from protocol.broker.client import WorkerIdentity
from protocol.sealed import ReplayGuard, WorkerKey
from protocol.tracing import NoTracing, Tracing
from protocol.worker_status import ServingState, WorkerStatus


@dataclass
class LiveState:
    """What truly changes while the worker runs. Written only by the boot, the lease watcher, the
    attestation renewal and the drain (each through a method here); read by everything else."""

    status: ServingState = "starting"
    reason: str = ""  # a failed boot's category (never the exception text: it might carry data)
    booted: BootedWorker | None = None  # the model in memory; None before boot and once wiped
    lease: KeyLease | None = None  # the data key's lease; serving stops when it is not valid
    # (the bundle, its digest): computed once per bundle, as every receipt names it
    _evidence_digest: tuple[object, str] = field(default=(None, ""), repr=False)
    # Set by every status change below: the heartbeats (heartbeat.py) send at once rather than at their next
    # tick, so a gateway hears "ready" (or "standby", "starting", "failed", "draining") as it happens.
    # An asyncio.Event: set and waited on by the worker's event loop only (each status change runs there).
    changed: asyncio.Event = field(default_factory=asyncio.Event, repr=False, compare=False)
    # Run when the key is lost (lifecycle.revoke): what holds plaintext opened under the key drops it
    # (the retrieval service's open vector stores).
    _wipers: list[Callable[[], None]] = field(default_factory=list, repr=False, compare=False)

    @classmethod
    def serving(cls, booted: BootedWorker) -> LiveState:
        """A worker already serving `booted` (tests and benchmarks that skip the boot)."""
        return cls(status="ready", booted=booted)

    def ready(self, booted: BootedWorker) -> bool:
        """Serve `booted`; only from "starting" (False otherwise: the caller wipes what it booted)."""
        if self.status != "starting":
            return False
        self.status, self.booted = "ready", booted
        self.changed.set()
        return True

    def fail(self, reason: str) -> BootedWorker | None:
        """Stop serving for `reason` (a fixed category); returns the model it held, for the caller to wipe."""
        booted, self.booted = self.booted, None
        self.status, self.reason = "failed", reason
        for wipe in self._wipers:
            wipe()
        self.changed.set()
        return booted

    def on_wipe(self, wipe: Callable[[], None]) -> None:
        """``wipe`` runs when the worker stops serving (`fail`: the key revoked or its lease run out)."""
        self._wipers.append(wipe)

    def standby(self) -> bool:
        """A warm worker attested without a key and waits (enclave_worker/standby.py); only from "starting"."""
        if self.status != "starting":
            return False
        self.status = "standby"
        self.changed.set()
        return True

    def assign(self) -> bool:
        """A standby worker's assignment: back to "starting" for the ordinary boot; False from any other state."""
        if self.status != "standby":
            return False
        self.status = "starting"
        self.changed.set()
        return True

    def drain(self) -> bool:
        """Say "draining" (the gateway stops routing here); False when it was not serving."""
        if self.status != "ready":
            return False
        self.status = "draining"
        self.changed.set()
        return True

    def renewed(self, old: BootedWorker, new: BootedWorker) -> None:
        """Replace the model's attestation (a renewal) unless it was wiped or replaced meanwhile."""
        if self.booted is old:
            self.booted = new  # no `changed`: a renewal runs on a thread; the next beat carries it

    @property
    def embedder(self) -> ComputeEncoder | None:
        """The encoder a worker of an embedding model serves with (retrieval hangs on it), embedding on
        the engine's compute thread; None before boot, once wiped, or on a chat model's worker."""
        engine = self.booted.engine if self.booted is not None else None
        return engine.retrieval_encoder if isinstance(engine, EmbeddingEngine) else None

    def evidence_sha256(self) -> str:
        """`EvidenceBundle.digest()` of the evidence served now (renewals replace it), or ""."""
        bundle = self.booted.released.bundle if self.booted is not None else None
        digest = getattr(bundle, "digest", None)
        if not callable(digest):
            return ""
        if self._evidence_digest[0] is not bundle:
            self._evidence_digest = (bundle, str(digest()))
        return self._evidence_digest[1]


@dataclass(frozen=True)
class WorkerState:
    """One worker process: its settings, its in-memory keys, the tenant's policy and its live state."""

    settings: WorkerSettings
    # The tenant's signed policy set as checked at startup (None: no data controls, or not readable:
    # then `live` says "failed" and nothing boots).
    guard: WorkerGuard | None = None
    # DER public key of the worker's mTLS identity (empty without mTLS); with the usage key, the
    # channel binding the attestation covers.
    tls_spki: bytes = b""
    live: LiveState = field(default_factory=LiveState)
    # Signs usage records; made at start and never stored, so only this process can sign as this worker.
    usage_key: Ed25519PrivateKey = field(default_factory=Ed25519PrivateKey.generate)
    # Sealed mode: the HPKE key clients encrypt to. Made at start, memory only, attested at key
    # release (its public key is the runtime data's hpke_public_key), kept for the process's life.
    serving_key: WorkerKey = field(default_factory=WorkerKey.generate)
    salt_secret: bytes = field(default_factory=lambda: secrets.token_bytes(32), repr=False)
    replay: ReplayGuard = field(default_factory=ReplayGuard)
    clock: Clock = field(default_factory=Clock)  # a fixed one in tests (no test asserts a duration)
    # Usage and sealed decision records of calls that ended early, for the next heartbeats.
    outbox: Outbox = field(default_factory=Outbox)
    # Spans of each call (docs/tracing.md); NoTracing (nothing at all) unless OTEL_* turns it on.
    tracing: Tracing = field(default_factory=NoTracing)
    cold_start: ColdStart = field(default_factory=ColdStart)  # this process's start, phase by phase

    @property
    def booted(self) -> BootedWorker | None:
        return self.live.booted

    @property
    def channel_binding(self) -> bytes:
        """What the evidence commits to: exactly this worker's mTLS key and usage key."""
        return channel_binding(self.tls_spki, public_key_bytes(self.usage_key))

    @cached_property
    def records(self) -> TenantRecords:
        """The tenant's sealed decision records, under the key its signed policy set names (if any)."""
        policy_set = self.guard.policy_set if self.guard else None
        return TenantRecords(policy_set.decision_record_key if policy_set else None, self.usage_key,
                             self.settings.model, self.settings.version)

    @cached_property
    def signer(self) -> RequestSigner:
        """Signs this worker's usage records and in-enclave decisions (`enclave_worker/signing.py`)."""
        return RequestSigner(self.usage_key, self.settings.model, self.settings.version)

    @cached_property
    def usage_public_hex(self) -> str:
        """The usage key's raw public key, hex (receipts name it: a third party checks them with it)."""
        return self.usage_key.public_key().public_bytes(serialization.Encoding.Raw,
                                                        serialization.PublicFormat.Raw).hex()

    def identity(self) -> WorkerIdentity:
        return WorkerIdentity(self.usage_key, self.tls_spki)

    def cache_salt(self, tenant: str) -> bytes:
        # Derived here, never taken from a client: tenants cannot share or probe each other's prefix cache.
        return hmac.new(self.salt_secret, tenant.encode(), hashlib.sha256).digest()

    def promises(self) -> dict[str, Any]:
        return self.settings.promises()

    def evidence_sha256(self) -> str:
        """The digest of the evidence this worker serves now: every receipt names it, so a third party
        knows which evidence to check it with."""
        return self.live.evidence_sha256()

    def report(self) -> WorkerStatus:
        """What this worker says about itself (`/internal/status`, the heartbeat's body)."""
        s, live, booted = self.settings, self.live, self.live.booted
        return WorkerStatus(
            status=live.status, reason=live.reason, tenant=s.tenant, model=s.model, version=s.version, tee=s.tee,
            gpu_tee=s.gpu_tee, insecure=s.insecure, device=s.device, dtype=s.dtype, kernel_path=s.kernel_path or "",
            gpu_cc_off=bool(booted and booted.gpu_cc_off), load_s=round(booted.load_s, 3) if booted else None,
            gpu_memory=gpu_memory() if s.on_gpu else None, tool_call_syntax=self._tool_call_syntax(),
            stats={**(booted.engine.stats() if booted else {}), **self.cold_start.stats()})

    def _tool_call_syntax(self) -> str:
        """The served model's tool-call syntax, as every answer with tools reads it."""
        tokenizer = getattr(self.live.booted.engine, "tokenizer", None) if self.live.booted else None
        if tokenizer is None:  # not booted (or a stand-in engine without one)
            return ""
        syntax = syntax_for_template(tokenizer.chat_template)
        return syntax.name if syntax.checked else f"{syntax.name}_lenient"


def gpu_memory() -> dict[str, int]:
    """Bytes on the worker's GPU: what torch holds for tensors, reserves, and the device's free/total."""
    import torch

    free, total = torch.cuda.mem_get_info()
    return {"allocated": torch.cuda.memory_allocated(), "reserved": torch.cuda.memory_reserved(),
            "free": free, "total": total}
