"""The worker's internal API (gateway -> worker): status, attestation, streaming generation.

Boot happens in the background so the gateway can see "starting" and "failed" states; a failed
boot (for instance, the key broker refused the key) is reported as unavailable, never as a hang.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import hmac
import logging
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from fastapi import FastAPI
from fastapi.responses import JSONResponse

from attestation.errors import AttestationError
from enclave_worker.boot import BootedWorker, boot
from enclave_worker.clock import Clock
from enclave_worker.cold_start import ColdStart
from enclave_worker.engine.compute_thread import on_a_passing_thread
from enclave_worker.freshness import AttestationRenewal
from enclave_worker.guard import WorkerGuard, build_guard
from enclave_worker.keywatch import KeyLease, LeaseTiming
from enclave_worker.outbox import Outbox
from enclave_worker.settings import WorkerSettings
from enclave_worker.signing import RequestSigner
from enclave_worker.standby import Standby
from enclave_worker.tenant_records import TenantRecords
from enclave_worker.tool_syntax import syntax_for_template
from policy.errors import PolicyError
from protocol.asgi import without_native_telemetry
from protocol.broker.client import WorkerIdentity
from protocol.broker.errors import BrokerNotAuthenticated, BrokerRateLimited, BrokerRefused
from protocol.package.errors import PackageError
from protocol.sealed import ReplayGuard, WorkerKey
from protocol.tracing import NoTracing, Tracing
from protocol.worker_status import BROKER_RATE_LIMITED, BROKER_UNREACHABLE, LEASE_EXPIRED, ServingState, WorkerStatus

log = logging.getLogger(__name__)


@dataclass
class WorkerState:
    settings: WorkerSettings
    status: ServingState = "starting"
    reason: str = ""  # a failed boot's category (never the exception text: it might carry data)
    booted: BootedWorker | None = None
    guard: WorkerGuard | None = None
    channel_binding: bytes = b""  # set before boot: attestation covers the TLS and usage keys
    tls_spki: bytes = b""  # DER public key of the worker's mTLS identity (empty without mTLS)
    lease: KeyLease | None = None  # the data key's lease; serving stops when it is not valid
    salt_secret: bytes = field(default_factory=lambda: secrets.token_bytes(32))
    # Signs usage records; made at boot and never stored, so only this process can sign as this worker.
    usage_key: Ed25519PrivateKey = field(default_factory=Ed25519PrivateKey.generate)
    # Sealed mode: the HPKE key clients encrypt to. Made at start, memory only, attested at key
    # release (its public key is the runtime data's hpke_public_key), kept for the process's life.
    serving_key: WorkerKey = field(default_factory=WorkerKey.generate)
    replay: ReplayGuard = field(default_factory=ReplayGuard)
    clock: Clock = field(default_factory=Clock)  # a fixed one in tests (no test asserts a duration)
    # Set by the process that serves gRPC: on shutdown it lets in-flight streams finish first.
    drain: Callable[[], Awaitable[None]] | None = None
    # Usage and sealed decision records of calls that ended early, for the next heartbeats.
    outbox: Outbox = field(default_factory=Outbox)
    # Spans of each call (docs/tracing.md); NoTracing (nothing at all) unless OTEL_* turns it on.
    tracing: Tracing = field(default_factory=NoTracing)
    cold_start: ColdStart = field(default_factory=ColdStart)  # this process's start, phase by phase
    _records: TenantRecords | None = None
    _evidence_digest: tuple[object, str] = (None, "")  # (the bundle, its digest): receipts name it

    @property
    def records(self) -> TenantRecords:
        """The tenant's sealed decision records, under the key its signed policy set names (if any)."""
        if self._records is None:
            policy_set = self.guard.policy_set if self.guard else None
            self._records = TenantRecords(policy_set.decision_record_key if policy_set else None, self.usage_key,
                                          self.settings.model, self.settings.version)
        return self._records

    @property
    def signer(self) -> RequestSigner:
        """Signs this worker's usage records and in-enclave decisions (`enclave_worker/signing.py`)."""
        return RequestSigner(self.usage_key, self.settings.model, self.settings.version)

    def report(self) -> WorkerStatus:
        """What this worker says about itself (`/internal/status`, the heartbeat's body)."""
        s = self.settings
        booted = self.booted
        return WorkerStatus(
            status=self.status, reason=self.reason, tenant=s.tenant, model=s.model, version=s.version, tee=s.tee,
            gpu_tee=s.gpu_tee,
            insecure=s.insecure, device=s.device, dtype=s.dtype, gpu_cc_off=bool(booted and booted.gpu_cc_off),
            load_s=round(booted.load_s, 3) if booted else None, gpu_memory=gpu_memory() if s.on_gpu else None,
            tool_call_syntax=self._tool_call_syntax(),
            stats={**(booted.engine.stats() if booted else {}), **self.cold_start.stats()})

    def _tool_call_syntax(self) -> str:
        """The served model's tool-call syntax, as every answer with tools reads it."""
        tokenizer = getattr(self.booted.engine, "tokenizer", None) if self.booted else None
        if tokenizer is None:  # not booted (or a stand-in engine without one)
            return ""
        syntax = syntax_for_template(tokenizer.chat_template)
        return syntax.name if syntax.checked else f"{syntax.name}_lenient"

    def promises(self) -> dict[str, Any]:
        return self.settings.promises()

    def evidence_sha256(self) -> str:
        """`EvidenceBundle.digest()` of the evidence this worker serves now (renewals replace it), computed
        once per bundle: every receipt names it, so a third party knows which evidence to check it with."""
        booted = self.booted
        bundle = booted.released.bundle if booted is not None else None
        if bundle is None:
            return ""
        if self._evidence_digest[0] is not bundle:
            digest = getattr(bundle, "digest", None)
            self._evidence_digest = (bundle, str(digest()) if callable(digest) else "")
        return self._evidence_digest[1]

    @property
    def usage_public_hex(self) -> str:
        """The usage key's raw public key, hex (receipts name it: a third party checks them with it)."""
        return self.usage_key.public_key().public_bytes(serialization.Encoding.Raw,
                                                        serialization.PublicFormat.Raw).hex()

    def identity(self) -> WorkerIdentity:
        return WorkerIdentity(self.usage_key, self.tls_spki)

    def cache_salt(self, tenant: str) -> bytes:
        # Derived here, never taken from a client: tenants cannot share or probe each other's prefix cache.
        return hmac.new(self.salt_secret, tenant.encode(), hashlib.sha256).digest()


def gpu_memory() -> dict[str, int]:
    """Bytes on the worker's GPU: what torch holds for tensors, reserves, and the device's free/total."""
    import torch

    free, total = torch.cuda.mem_get_info()
    return {"allocated": torch.cuda.memory_allocated(), "reserved": torch.cuda.memory_reserved(),
            "free": free, "total": total}


def _error(status: int, message: str, type_: str = "invalid_request_error") -> JSONResponse:
    return JSONResponse(status_code=status, content={"error": {"message": message, "type": type_}})


async def _boot(state: WorkerState) -> None:
    s = state.settings
    try:
        # The tenant's signed policy first: no key is fetched for a worker that could not enforce it.
        state.guard = build_guard(s.policy_file, s.policy_admin_key, s.tenant, s.unsafe_no_tenant_policy,
                                  s.min_policy_version)
        if state.records.tenant_key is None:
            log.warning("the tenant's policy set names no decision_record_key: the tenant will not see this "
                        "worker's decisions on sealed requests (they are never sent in clear)")
        started = time.monotonic()
        policy_set = state.guard.policy_set if state.guard else None
        booted = await on_a_passing_thread(
            lambda: boot(s, state.channel_binding, state.serving_key.private_key, policy_set, state.tracing,
                         state.cold_start), "boot")
        state.booted = booted
        state.status = "ready"
        # Cold-start figure (docs/deploy.md): attestation + key release + package load + engine build.
        log.info("ready %.1f s after boot started (attest, key release, package load)", time.monotonic() - started)
    except Exception as exc:
        _boot_failed(state, exc)
        return
    # The token clients verify is renewed for the worker's whole life (enclave_worker/freshness.py).
    renewal = asyncio.create_task(AttestationRenewal(state).run())
    state.lease = KeyLease(s.broker_url, booted.released, state.identity(), s.ref,
                           LeaseTiming(lease_s=s.lease_s, watch_s=s.lease_watch_s), clock=state.clock.monotonic)
    try:
        await state.lease.run(lambda reason: _revoke(state, reason))
    finally:
        renewal.cancel()


def _boot_failed(state: WorkerState, exc: Exception) -> None:
    if isinstance(exc, AttestationError):
        # The attester's own words (no secrets: they name interfaces, modes and error codes), one
        # line: "GPU confidential computing is off", "not an SEV-SNP guest", ...
        state.status, state.reason = "failed", "attestation failed in the TEE"
        log.error("worker boot failed: %s: %s", type(exc).__name__, str(exc).splitlines()[0] if str(exc) else "")
        return
    # The reason is logged by type only: it may not carry secrets, but keep it terse.
    state.status, state.reason = "failed", failure_reason(exc)
    log.error("worker boot failed: %s (%s)", type(exc).__name__, state.reason)


def failure_reason(exc: BaseException) -> str:
    """A fixed category for /readyz and the control loop; the details stay in the audit logs."""
    if isinstance(exc, BrokerNotAuthenticated):
        return "key broker not authenticated"
    if isinstance(exc, BrokerRefused):
        return "key release refused by the key broker"
    if isinstance(exc, BrokerRateLimited):
        return BROKER_RATE_LIMITED
    if isinstance(exc, PackageError):
        return f"package rejected ({type(exc).__name__})"
    if isinstance(exc, httpx.HTTPError):
        return BROKER_UNREACHABLE
    if isinstance(exc, FileNotFoundError):
        return "package or policy file missing"
    if isinstance(exc, (PolicyError, ValueError)):
        return "tenant policy or package metadata invalid"
    return f"boot failed ({type(exc).__name__})"


LOST_REASONS = {  # a fixed category for the heartbeat and /readyz (the broker's audit log has the cause)
    "revoked": "data key revoked by the key broker (or the tenant no longer trusts this worker)",
    "lease-expired": LEASE_EXPIRED,
}


def _revoke(state: WorkerState, why: str = "") -> None:
    """The key was revoked, the tenant's trust withdrawn or the lease ran out: stop serving and
    wipe every plaintext weight now. The heartbeat then says "failed" (the gateway stops routing)."""
    state.status, state.reason = "failed", LOST_REASONS.get(why, "data key revoked or its lease ran out")
    booted, state.booted = state.booted, None
    lease = state.lease
    if lease is not None:
        lease.end()
        # Drop the last references to the data key (bytes: Python cannot zero them in place).
        lease.released = dataclasses.replace(lease.released, data_key=b"")
    if booted is not None:
        booted.wipe()
        asyncio.get_running_loop().create_task(booted.engine.shutdown())


def serving(state: WorkerState) -> bool:
    """Whether requests may run: booted and the key's lease is live. A lease found expired here
    (should the watcher ever lag) wipes at once."""
    if state.booted is None:
        return False
    if state.lease is not None and not state.lease.valid():
        log.error("key lease expired: wiping the model and refusing requests")
        _revoke(state)
        return False
    return True


def create_app(settings: WorkerSettings, state: WorkerState | None = None) -> FastAPI:
    state = state or WorkerState(settings)
    standby = Standby() if settings.standby else None  # a warm worker waits for its assignment first

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        task = asyncio.create_task(_boot(state) if standby is None else standby.run(state, _boot, _boot_failed))
        yield
        task.cancel()
        # uvicorn runs this on SIGTERM and re-raises the signal afterwards, so the drain must
        # happen here, before the engine stops under the streams it is still serving.
        if state.drain is not None:
            await state.drain()
        if state.booted is not None:
            await state.booted.engine.shutdown()

    app = FastAPI(title="Sealed worker (internal)", docs_url=None, redoc_url=None, lifespan=lifespan,
                  **without_native_telemetry())
    app.state.worker = state
    if standby is not None:
        app.include_router(standby.router(state))

    @app.get("/internal/status")
    def status() -> WorkerStatus:
        return state.report()

    @app.get("/internal/readyz")
    def readyz() -> JSONResponse:
        """For a pod's readiness probe: 200 only while the model is loaded and serving."""
        return JSONResponse(status_code=200 if state.status == "ready" else 503,
                            content={"status": state.status, "reason": state.reason})

    @app.get("/internal/attestation")
    def attestation() -> JSONResponse:
        if state.booted is None:
            return _error(503, "model unavailable", "unavailable")
        released = state.booted.released
        return JSONResponse({"tee": state.settings.tee, "insecure": state.settings.insecure,
                             "evidence": released.bundle.to_json(), "token": released.token,
                             "model_digest": state.booted.model_digest,
                             "sealed_key_id": state.serving_key.key_id,
                             "promises": state.promises()})

    return app
