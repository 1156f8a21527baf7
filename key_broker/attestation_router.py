"""`POST /v1/broker/attestation`: the broker's identity document and fresh evidence binding it.

Public (like a worker's `/.well-known/attestation`): what it discloses is public keys and the
measured configuration. Rate-limited per caller with the worker routes' limiter, audited on refusal.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from attestation.errors import AttestationError
from key_broker.dependencies import client_address, get_service
from key_broker.service import KeyBrokerService
from protocol.broker.identity import BrokerAttestationRequest, BrokerAttestationResponse

router = APIRouter()


@router.post("/v1/broker/attestation", response_model=BrokerAttestationResponse)
async def broker_attestation(body: BrokerAttestationRequest, service: KeyBrokerService = Depends(get_service),
                             client: str = Depends(client_address)) -> Any:
    if service.attested is None:
        return JSONResponse(status_code=503, content={"error": {"type": "unavailable", "message": "not attested"}})
    service.check_rate("broker-attestation", client)
    try:
        answer = await run_in_threadpool(service.attested.attest, bytes.fromhex(body.nonce))
    except AttestationError as exc:  # the broker's own TEE failed to answer: say so, audit why
        service.refuse("-", "broker-attestation", f"{type(exc).__name__}: {exc}", {})
        return JSONResponse(status_code=503, content={"error": {"type": "unavailable",
                                                                "message": "attestation unavailable"}})
    return BrokerAttestationResponse(**answer)


@router.post("/v1/broker/tenants/{tenant}/governing-key")
def governing_key(tenant: str, body: BrokerAttestationRequest, request: Request,
                  service: KeyBrokerService = Depends(get_service), client: str = Depends(client_address)) -> Any:
    """Which policy-admin key governs ``tenant`` at this broker instance, signed by its attested
    instance key over the caller's nonce (public: it discloses a public key). The tenant's CLI
    checks it before it sends a data key, a policy or a registration (protocol/broker/tenancy.py)."""
    service.check_rate("governing-key", client)
    return request.app.state.admin.governing_key(tenant, body.nonce)
