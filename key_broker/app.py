"""create_app(settings): wires the key broker's parts; nothing is built at import time."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from fastapi import FastAPI, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from attestation.collateral import CollateralConfig, CollateralStore
from attestation.token import TokenIssuer
from attestation.verifier import VerifierTrust
from key_broker import admin_router
from key_broker.attestation_router import router as broker_attestation_router
from key_broker.attested import broker_self, instance_id
from key_broker.auth import AdminTokenStore
from key_broker.errors import (
    Forbidden,
    InvalidName,
    KeyBrokerError,
    RateLimited,
    ReferenceValuesError,
    SettingsError,
)
from key_broker.keystore import DataKeyRegistry, KeyStore, LocalKeyStore
from key_broker.leases import LeaseBook, LeaseSettings
from key_broker.limits import RateLimits, reject_too_large
from key_broker.platform import open_platform
from key_broker.policies import PolicyStore
from key_broker.receipts import ReceiptBook
from key_broker.refvals import ReferenceValuesStore
from key_broker.router import router
from key_broker.sealed_keys import open_broker_keys
from key_broker.service import COMPONENT, EvidenceVerifier, KeyBrokerService
from key_broker.settings import BrokerSettings
from key_broker.statefile import (
    LEDGER,
    FileAnchor,
    StateLedger,
    StateTampered,
    VaultKvAnchor,
    VaultStateMac,
    default_anchor_path,
    local_ledger,
    state_files_to_adopt,
    tenant_of,
)
from key_broker.tenants import Conflict, TenantAdmin
from policy.audit import AuditLog, CheckpointAnchor, SqlAnchor, WitnessFile
from policy.audit.entry import bounded_reason
from policy.audit.stream.embedded import forwarding_from_env
from policy.errors import AuditIntegrityError, PolicyInvalid
from protocol.asgi import without_native_telemetry
from protocol.body_limit import BodyLimit
from protocol.fsutil import atomic_write
from protocol.tracing import tracing_from_env

log = logging.getLogger(__name__)


def open_audit_log(audit_dir: Path, component: str, key: Ed25519PrivateKey, *,
                   anchors: Sequence[CheckpointAnchor] = ()) -> AuditLog:
    """This component's log in the shared audit dir, with its public key published beside it;
    checkpoints also go to ``anchors`` (checked when the log is reopened)."""
    atomic_write(audit_dir / "keys" / f"{component}.pem",
                 key.public_key().public_bytes(serialization.Encoding.PEM,
                                               serialization.PublicFormat.SubjectPublicKeyInfo), mode=0o644)
    return AuditLog(audit_dir / f"{component}.audit.jsonl", key, component, anchors=anchors)


def audit_anchors(witness: Path | None, anchor_url: str | None) -> list[CheckpointAnchor]:
    anchors: list[CheckpointAnchor] = []
    if witness is not None:
        anchors.append(WitnessFile(witness))
    if anchor_url:
        anchors.append(SqlAnchor(anchor_url))
    return anchors


def build_keystore(settings: BrokerSettings, master: bytes, instance: str = "") -> tuple[KeyStore, StateLedger]:
    """The key store and the state ledger every store reads and writes through (docs/key-broker.md,
    "State integrity"): MACed under the master key (sealed with the broker's keys), or by a Transit
    HMAC key in Vault mode."""
    anchor_path = settings.state_anchor or default_anchor_path(settings.data_dir)
    if settings.keystore == "vault":
        from key_broker.vault import VaultTransitKeyStore

        assert settings.vault_url and settings.vault_token  # checked by BrokerSettings
        vault = VaultTransitKeyStore.connect(settings.vault_url, settings.vault_token,
                                             settings.data_dir / "vault-state", settings.vault_mount)
        mac = VaultStateMac(vault.client, settings.vault_mount)
        # The Transit MAC key outlives a broker instance: the anchors name the instance too.
        ledger = StateLedger(settings.data_dir, mac, [
            FileAnchor(anchor_path, mac, instance),
            VaultKvAnchor(vault.client, mount_point=settings.vault_kv_mount, instance=instance)])
        return VaultTransitKeyStore(vault.client, settings.data_dir / "vault-state", settings.vault_mount,
                                    ledger), ledger
    ledger = local_ledger(settings.data_dir, master, anchor_path)
    return LocalKeyStore(settings.data_dir / "keystore", master, ledger), ledger


def open_state(settings: BrokerSettings, ledger: StateLedger, audit: AuditLog) -> None:
    """Audit every refused state file, check them all now, and refuse to start on a ledger that
    does not authenticate or was rolled back, or on a data directory from before the ledger."""

    def audit_tamper(what: str, why: str) -> None:
        audit.append(tenant=tenant_of(what), action="state-integrity", decision="deny",
                     reason=f"StateTampered: {why}", metadata={"file": what[:200]})

    ledger.on_tamper = audit_tamper
    existing = state_files_to_adopt(settings.data_dir)
    if settings.init:  # a fresh broker (its keys were made just now): anchors and an empty ledger
        if existing:
            raise SettingsError("--init makes a fresh broker only in an empty data directory: "
                                f"{settings.data_dir} holds state files")
        ledger.initialise()
        audit.append(tenant="-", action="broker-init", decision="allow", reason="init",
                     metadata={"generation": ledger.generation})
        return
    if settings.unsafe_adopt_state:
        if not ledger.path.exists():
            ledger.initialise()
        count = ledger.adopt(existing)
        log.warning("UNSAFE: adopted %d unauthenticated state files as they are on disk", count)
        audit.append(tenant="-", action="state-adopt", decision="allow", reason="unsafe_adopt_state",
                     metadata={"files": count})
    elif existing and not ledger.path.exists():
        raise SettingsError("the broker's state predates the state ledger (no integrity record): check it, "
                            "then start once with --unsafe-adopt-state")
    ledger.check_anchors()  # missing, unreadable, another instance's or older: the broker does not start
    for problem in ledger.check_all():
        log.critical("state file refused at start-up: %s", problem)


def build_service(settings: BrokerSettings, *, clock: Callable[[], dt.datetime] | None = None,
                  verify: EvidenceVerifier | None = None) -> KeyBrokerService:
    """The release service over the on-disk stores. `clock` and `verify` are for tests (a
    controllable clock; a verifier over test roots); by default: UTC now, verify_bundle."""
    data_dir = settings.data_dir
    data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    # The broker's keys: generated inside its TEE on the first start, on disk only sealed to its measurement.
    platform = open_platform(settings)
    if settings.init and (state_files_to_adopt(data_dir) or (data_dir / LEDGER).exists()):  # before any key is made
        raise SettingsError(f"--init makes a fresh broker only in an empty data directory: {data_dir} holds state")
    keys = open_broker_keys(data_dir, platform, unsafe_sim_reseal=settings.unsafe_sim_reseal, init=settings.init)
    token_key, receipt_key = keys.token_key, keys.receipt_key
    keystore, ledger = build_keystore(settings, keys.master_key, instance_id(keys.instance_key.public_key()))
    sim_key = None
    if settings.sim_platform_public_key is not None:
        loaded = serialization.load_pem_public_key(settings.sim_platform_public_key.read_bytes())
        if not isinstance(loaded, Ed25519PublicKey):
            raise ValueError("sim platform key must be Ed25519")
        sim_key = loaded
        log.warning("key broker accepts simulated-TEE evidence (still subject to each release policy)")
    issuer = TokenIssuer(token_key, settings.issuer, settings.token_ttl)
    # Served at /.well-known/jwks.json; relying parties take it from the broker's attested identity
    # (POST /v1/broker/attestation). This copy is a convenience for the one-machine demo.
    atomic_write(data_dir / "jwks.json", json.dumps(issuer.jwks(), indent=1).encode(), mode=0o644)
    attested = broker_self(settings, platform, keys, issuer.jwks())
    policies = PolicyStore(data_dir, ledger)
    audit = open_audit_log(data_dir.parent / "audit", COMPONENT, receipt_key,
                           anchors=audit_anchors(settings.audit_witness, settings.audit_anchor_url))
    try:
        open_state(settings, ledger, audit)
    except BaseException:
        audit.close()
        raise
    snp_fetcher = tdx_collateral = gpu_collateral = None
    if settings.collateral_dir is not None:
        store = CollateralStore(CollateralConfig(settings.collateral_dir, offline=settings.collateral_offline))
        snp_fetcher, tdx_collateral, gpu_collateral = store.snp, store.tdx, store.nvidia
    else:
        log.warning("no collateral store configured: TDX evidence is refused and SNP CRLs are not checked")
    return KeyBrokerService(
        keystore=keystore,
        datakeys=DataKeyRegistry(data_dir / "keystore", keystore, ledger),
        policies=policies,
        refvals=ReferenceValuesStore(data_dir, ledger),
        receipts=ReceiptBook(data_dir, receipt_key),
        trust=VerifierTrust(roots_dir=settings.roots_dir, sim_platform_key=sim_key, snp_fetcher=snp_fetcher,
                            tdx_collateral=tdx_collateral, gpu_collateral=gpu_collateral),
        issuer=issuer,
        audit=audit,
        state=ledger,
        clock=clock or (lambda: dt.datetime.now(dt.UTC)),
        challenge_ttl=settings.challenge_ttl,
        limits=RateLimits(settings.rate_limit_per_minute),
        verify=verify,
        attested=attested,
        import_key=keys.import_key,
    )


def _error(status: int, kind: str, message: str) -> JSONResponse:
    return JSONResponse(status_code=status, content={"error": {"type": kind, "message": message}})


HTTP_CODES = {401: "unauthorized", 403: "forbidden", 404: "not_found", 405: "method_not_allowed"}


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        # Audited in aggregate (the caller chooses how many; policy/audit/edge.py).
        request.app.state.service.edge.refused(request.scope, 422, "invalid_request")
        # Field names only: a value could be a key or a token.
        fields = sorted({".".join(str(p) for p in e["loc"][1:]) for e in exc.errors()})
        return _error(422, "invalid_request", f"invalid fields: {fields}")

    @app.exception_handler(StarletteHTTPException)
    async def http_refusal(request: Request, exc: StarletteHTTPException) -> Response:
        # 401/403 of the admin API, 404, 405: audited in aggregate too, answered as before.
        request.app.state.service.edge.refused(request.scope, exc.status_code, HTTP_CODES.get(exc.status_code, "http"))
        return await http_exception_handler(request, exc)

    @app.exception_handler(RateLimited)
    async def limited(_: Request, exc: RateLimited) -> JSONResponse:
        response = _error(429, "rate_limited", "too many requests")
        response.headers["Retry-After"] = "1"
        return response

    @app.exception_handler(KeyBrokerError)
    async def broker_error(_: Request, exc: KeyBrokerError) -> JSONResponse:
        # Only admin routes let these through (worker routes answer one opaque refusal). Messages
        # name tenants, models and versions, never key material.
        if isinstance(exc, StateTampered):  # the cause is in the audit log and the broker's log
            return _error(503, "unavailable", "broker state failed its integrity check")
        if isinstance(exc, Conflict):
            return _error(409, "conflict", str(exc))
        if isinstance(exc, Forbidden):
            return _error(403, "forbidden", "not allowed")
        if isinstance(exc, InvalidName | ReferenceValuesError):
            return _error(422, "invalid_request", bounded_reason(str(exc)))
        return _error(400, "invalid_request", bounded_reason(str(exc)))

    @app.exception_handler(PolicyInvalid)
    async def policy_invalid(_: Request, exc: PolicyInvalid) -> JSONResponse:
        # Messages may quote the submitted value: bounded like an audit reason (no PEM, no blobs).
        return _error(422, "invalid_policy", bounded_reason(str(exc))[:300])

    @app.exception_handler(AuditIntegrityError)
    async def audit_broken(_: Request, exc: AuditIntegrityError) -> JSONResponse:
        # The audit log cannot record this decision (replaced, truncated or unwritable): nothing
        # is released without its record; the operator sees the cause in the broker's log.
        log.critical("audit log unusable, refusing service: %s", exc)
        return _error(503, "unavailable", "audit log unavailable")


def create_app(settings: BrokerSettings, service: KeyBrokerService | None = None,
               admin: TenantAdmin | None = None) -> FastAPI:
    svc = service or build_service(settings)
    tenant_admin = admin or TenantAdmin(
        keystore=svc.keystore, datakeys=svc.datakeys, policies=svc.policies, refvals=svc.refvals,
        receipts=svc.receipts, tokens=AdminTokenStore(settings.data_dir / "admin-tokens.json",
                                                      settings.admin_token_sha256, svc.state),
        audit=svc.audit, clock=svc.clock,
        import_key=svc.import_key, attested=svc.attested)

    tracing = tracing_from_env("key-broker")  # NoTracing unless OTEL_* asks (docs/tracing.md)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        # Its audit log to the SIEM when SEALED_AUDIT_FORWARD names a config (docs/siem.md).
        forwarding = forwarding_from_env({svc.audit.component: svc.audit.path.parent})
        yield
        if forwarding is not None:
            forwarding.stop()
        svc.close()
        tracing.shutdown()

    app = FastAPI(title="Sealed key broker", docs_url=None, redoc_url=None, lifespan=lifespan,
                  **without_native_telemetry())
    app.state.service = svc
    app.state.tracing = tracing
    app.state.leases = LeaseBook(svc, LeaseSettings(lease_s=settings.lease_s, max_wait_s=settings.lease_max_wait_s))
    app.state.admin = tenant_admin
    app.state.import_public = tenant_admin.import_key.public_key()
    app.include_router(router)
    app.include_router(admin_router.router)
    app.include_router(broker_attestation_router)
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes, reject=reject_too_large)
    _install_error_handlers(app)
    return app
