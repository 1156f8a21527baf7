"""create_app(settings): wires the key broker's parts; nothing is built at import time."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from attestation.token import TokenIssuer
from attestation.verifier import VerifierTrust
from key_broker.fsutil import atomic_write
from key_broker.keystore import DataKeyRegistry, LocalKeyStore, load_master_key
from key_broker.policies import PolicyStore
from key_broker.receipts import ReceiptBook
from key_broker.router import router
from key_broker.service import COMPONENT, KeyBrokerService
from key_broker.settings import BrokerSettings
from policy.audit import AuditLog


def open_audit_log(audit_dir: Path, component: str, key: Ed25519PrivateKey) -> AuditLog:
    """This component's log in the shared audit dir, with its public key published beside it."""
    atomic_write(audit_dir / "keys" / f"{component}.pem",
                 key.public_key().public_bytes(serialization.Encoding.PEM,
                                               serialization.PublicFormat.SubjectPublicKeyInfo), mode=0o644)
    return AuditLog(audit_dir / f"{component}.audit.jsonl", key, component)

log = logging.getLogger(__name__)


def _private_key(path, generate, load):  # type: ignore[no-untyped-def]
    if not path.exists():
        key = generate()
        atomic_write(path, key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                             serialization.NoEncryption()))
        return key
    return load(path.read_bytes())


def load_broker_keys(data_dir) -> tuple[ec.EllipticCurvePrivateKey, Ed25519PrivateKey]:  # type: ignore[no-untyped-def]
    """The token-signing key (ES256) and the receipt/audit signing key (Ed25519), 0600 PEM files."""
    token_key = _private_key(data_dir / "token-signing.pem", lambda: ec.generate_private_key(ec.SECP256R1()),
                             lambda b: serialization.load_pem_private_key(b, None))
    receipt_key = _private_key(data_dir / "receipt-signing.pem", Ed25519PrivateKey.generate,
                               lambda b: serialization.load_pem_private_key(b, None))
    return token_key, receipt_key


def build_service(settings: BrokerSettings) -> KeyBrokerService:
    data_dir = settings.data_dir
    data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    keystore = LocalKeyStore(data_dir / "keystore", load_master_key(settings.master_key_file
                                                                    or data_dir / "master.key"))
    token_key, receipt_key = load_broker_keys(data_dir)
    sim_key = None
    if settings.sim_platform_public_key is not None:
        loaded = serialization.load_pem_public_key(settings.sim_platform_public_key.read_bytes())
        if not isinstance(loaded, Ed25519PublicKey):
            raise ValueError("sim platform key must be Ed25519")
        sim_key = loaded
        log.warning("key broker accepts simulated-TEE evidence (still subject to each release policy)")
    issuer = TokenIssuer(token_key, settings.issuer, settings.token_ttl)
    # Relying parties pin this JWKS (it is also served at /.well-known/jwks.json).
    atomic_write(data_dir / "jwks.json", json.dumps(issuer.jwks(), indent=1).encode(), mode=0o644)
    return KeyBrokerService(
        keystore=keystore,
        datakeys=DataKeyRegistry(data_dir / "keystore", keystore),
        policies=PolicyStore(data_dir),
        receipts=ReceiptBook(data_dir, receipt_key),
        trust=VerifierTrust(roots_dir=settings.roots_dir, sim_platform_key=sim_key),
        issuer=issuer,
        audit=open_audit_log(data_dir.parent / "audit", COMPONENT, receipt_key),
        clock=lambda: dt.datetime.now(dt.UTC),
        challenge_ttl=settings.challenge_ttl,
    )


def create_app(settings: BrokerSettings, service: KeyBrokerService | None = None) -> FastAPI:
    svc = service or build_service(settings)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        svc.close()

    app = FastAPI(title="Sealed key broker", docs_url=None, redoc_url=None, lifespan=lifespan)
    app.state.service = svc
    app.include_router(router)

    @app.middleware("http")
    async def limit_body(request: Request, call_next):  # type: ignore[no-untyped-def]
        length = request.headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > settings.max_body_bytes):
            return JSONResponse(status_code=413, content={"error": {"type": "invalid_request",
                                                                    "message": "body too large"}})
        return await call_next(request)

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        fields = sorted({".".join(str(p) for p in e["loc"][1:]) for e in exc.errors()})
        return JSONResponse(status_code=422, content={"error": {"type": "invalid_request",
                                                                "message": f"invalid fields: {fields}"}})

    return app
