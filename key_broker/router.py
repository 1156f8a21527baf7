"""Worker-facing routes of the key broker. Every refusal is the same opaque 403."""

from __future__ import annotations

import base64
import time
from typing import Any

from cryptography.hazmat.primitives import serialization
from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from attestation.bundle import EvidenceBundle
from attestation.errors import ParseError
from key_broker.dependencies import client_address, get_service
from key_broker.errors import ReleaseRefused
from key_broker.leases import LeaseBook
from key_broker.service import KeyBrokerService
from key_broker.tracing import release_span
from protocol.broker.schemas import (
    AttestRequest,
    AttestResponse,
    ChallengeResponse,
    KeyRequest,
    KeyResponse,
    KeyStatusRequest,
    KeyStatusResponse,
    LeaseRequest,
    LeaseResponse,
)
from protocol.package.keywrap import import_key_id

router = APIRouter()

REFUSED = {"error": {"type": "refused", "message": "request refused"}}
STATUS_POLL_SECONDS = 30


def refused() -> JSONResponse:
    return JSONResponse(status_code=403, content=REFUSED)


@router.post("/v1/challenge", response_model=ChallengeResponse)
def challenge(service: KeyBrokerService = Depends(get_service),
              client: str = Depends(client_address)) -> ChallengeResponse | JSONResponse:
    try:
        c = service.challenge(client)
    except ReleaseRefused:
        return refused()
    return ChallengeResponse(session_id=c.session_id, nonce=c.nonce.hex(),
                             expires_at=c.expires_at.isoformat())


@router.post("/v1/attest", response_model=AttestResponse)
def attest(body: AttestRequest, request: Request, service: KeyBrokerService = Depends(get_service),
           client: str = Depends(client_address)) -> AttestResponse | JSONResponse:
    with release_span(request, "broker.attest", body.tenant, body.model) as span:
        span.set("sealed.decision", "deny")
        try:
            bundle = EvidenceBundle.from_json(body.evidence)
        except ParseError as exc:
            service.refuse(body.tenant, "attest", f"ParseError: malformed evidence bundle: {exc}",
                           {"model": body.model, "version": body.version})
            return JSONResponse(status_code=400, content={"error": {"type": "invalid_request",
                                                                    "message": "malformed evidence bundle"}})
        try:
            token = service.attest(session_id=body.session_id, bundle=bundle, ref=body.ref, client=client)
        except ReleaseRefused:
            return refused()
        span.set("sealed.decision", "allow")
        return AttestResponse(token=token)


@router.post("/v1/key", response_model=KeyResponse)
def key(body: KeyRequest, request: Request, service: KeyBrokerService = Depends(get_service)
        ) -> KeyResponse | JSONResponse:
    with release_span(request, "broker.key_release", body.tenant, body.model) as span:
        try:
            sealed = service.release(token=body.token, ref=body.ref)
        except ReleaseRefused:
            span.set("sealed.decision", "deny")
            return refused()
        span.set("sealed.decision", "allow")
    return KeyResponse(sealed_key=base64.b64encode(sealed.sealed).decode(), token_id=sealed.token_id,
                       receipt=sealed.receipt, release_policy=sealed.release_policy)


@router.post("/v1/key/status", response_model=KeyStatusResponse)
def key_status(body: KeyStatusRequest, service: KeyBrokerService = Depends(get_service),
               client: str = Depends(client_address)) -> KeyStatusResponse | JSONResponse:
    """Informational: whether the key a (public) attestation token was released under is revoked.
    Workers do not rely on it; they hold a lease (`POST /v1/lease`)."""
    try:
        status = service.key_status(token=body.token, ref=body.ref, client=client)
    except ReleaseRefused:
        return refused()
    return KeyStatusResponse(status=status, check_after_s=STATUS_POLL_SECONDS)


@router.post("/v1/lease", response_model=LeaseResponse)
async def lease(body: LeaseRequest, request: Request) -> LeaseResponse | JSONResponse:
    """Renew a key lease (signed by the worker's attested identity key). With `wait_s` the broker
    holds the request and answers at once on revocation: this is how revocation is pushed."""
    leases: LeaseBook = request.app.state.leases
    try:
        grant = await run_in_threadpool(leases.authenticate, body.model_dump())
    except ReleaseRefused:
        return refused()
    deadline = time.monotonic() + grant.wait_s
    while True:
        status = await run_in_threadpool(leases.status, grant)
        remaining = deadline - time.monotonic()
        if status != "active" or remaining <= 0:
            return LeaseResponse(**leases.answer(grant, status))
        await leases.changes.wait(min(remaining, leases.settings.recheck_s))


@router.get("/v1/import-key")
def import_key(request: Request) -> dict[str, Any]:
    """Where tenants seal data keys (`sealed encrypt --broker-import-key`); pin it from attestation."""
    public = request.app.state.import_public
    return {"import_key_id": import_key_id(public), "suite": "DHKEM-X25519-HKDF-SHA256/HKDF-SHA256/AES-256-GCM",
            "public_key_pem": public.public_bytes(serialization.Encoding.PEM,
                                                  serialization.PublicFormat.SubjectPublicKeyInfo).decode()}


@router.get("/.well-known/jwks.json")
def jwks(service: KeyBrokerService = Depends(get_service)) -> dict[str, Any]:
    return service.issuer.jwks()


@router.get("/v1/receipts/public-key")
def receipt_public_key(service: KeyBrokerService = Depends(get_service)) -> dict[str, Any]:
    """The broker's receipt-signing key (Ed25519 PEM); tenants pin it to verify receipts offline."""
    return {"alg": "Ed25519", "public_key_pem": service.receipts.public_key_pem}


@router.get("/healthz")
def healthz() -> dict[str, Any]:
    return {"status": "ok"}
