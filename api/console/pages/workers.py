"""The workers page: each worker's attestation as its signed heartbeats reported it, beside the
measurements the key broker's release policies allow (with the person's own broker token)."""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
import time
from typing import Any

import jwt
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from fastapi import APIRouter, Depends, Request
from fastapi.responses import HTMLResponse

from api.console.broker import BrokerUnavailable, BrokerView
from api.console.broker_token import broker_token
from api.console.pages.render import render
from api.console.session import Viewer, viewer
from api.console.state import Console
from api.gateway.dependencies import get_service
from api.gateway.service import GatewayService
from attestation.errors import AttestationError
from attestation.x509chain import BAD_DER

router = APIRouter(prefix="/console", include_in_schema=False)


def _cert_fingerprint(pem: str) -> str:
    if not pem:
        return ""
    try:
        cert = x509.load_pem_x509_certificate(pem.encode())
    except BAD_DER:  # what a worker registered is unchecked here (InvalidVersion is no ValueError)
        return "unreadable"
    return hashlib.sha256(cert.public_bytes(serialization.Encoding.DER)).hexdigest()[:16]


def token_claims(token: str, verifier: Any) -> tuple[dict[str, Any], str]:
    """The worker's attestation token claims and whether the broker's signature checks out."""
    if not token:
        return {}, "no token"
    try:
        claims = jwt.decode(token, options={"verify_signature": False})
    except jwt.PyJWTError:
        return {}, "malformed token"
    if verifier is None:
        return claims, "signature not checked (gateway has no broker JWKS)"
    try:
        verifier.verify(token, dt.datetime.fromtimestamp(int(claims.get("iat", 0)), dt.UTC))
    except (AttestationError, jwt.PyJWTError, ValueError, KeyError) as exc:
        return claims, f"signature INVALID ({type(exc).__name__})"
    return claims, "signed by the key broker"


def worker_rows(service: Any, attestations: list[dict[str, Any]], reference: dict[tuple[str, str], set[str]],
                who: Viewer, now: float) -> list[dict[str, Any]]:

    by_id = {a.get("worker_id"): a for a in attestations}
    reg = service.registry
    rows = []
    for w in sorted(reg.workers.values(), key=lambda w: (w.tenant, w.model, w.version, w.worker_id)):
        if not who.sees(w.tenant):
            continue
        doc = by_id.get(w.worker_id) or {}
        claims, token_state = token_claims(str(doc.get("token", "")), service.enrolment.verifier)
        measurement = str(claims.get("measurement", ""))
        allowed = reference.get((w.tenant, w.model))
        if not measurement:
            ref_state = "unknown"
        elif allowed is None:
            ref_state = "no reference values available"
        else:
            ref_state = "matches reference" if measurement in allowed else "NOT in the reference values"
        gpus = claims.get("gpus") or []
        exp = claims.get("exp")
        alive = reg.alive(w)
        rows.append({
            "worker_id": w.worker_id, "tenant": w.tenant, "model": w.model, "version": w.version,
            "status": w.status if alive else "unreachable", "routed": alive and w.status == "ready"
            and (w.attested or not reg.require_attestation),
            "tee": claims.get("tee") or w.tee, "insecure": bool(w.insecure or claims.get("insecure")),
            "tcb_status": claims.get("tcb_status", "unknown"), "tcb": claims.get("tcb") or {},
            "debug": claims.get("debug"), "measurement": measurement, "reference": ref_state,
            "gpu_cc": ("no GPU" if not gpus else
                       "on" if all(g.get("cc_enabled") for g in gpus) else "OFF"),
            "gpus": len(gpus), "token_state": token_state,
            "token_expires": (dt.datetime.fromtimestamp(int(exp), dt.UTC) if exp else None),
            "heartbeat_age_s": reg.heartbeat_age(w) if w.last_seen else None,
            "inflight": w.inflight, "tls": _cert_fingerprint(w.tls_cert),
            "attested": w.attested, "now": now,
        })
    return rows


async def _reference_values(broker: BrokerView, request: Request, tenants: set[str]
                            ) -> dict[tuple[str, str], set[str]]:
    out: dict[tuple[str, str], set[str]] = {}
    if not broker.configured:
        return out
    token = broker_token(request)
    if token is None:
        return out
    for tenant in tenants:
        try:
            policies = await asyncio.to_thread(broker.release_policies, tenant, token)
        except BrokerUnavailable:
            continue
        for p in policies:
            out.setdefault((tenant, str(p.get("model"))), set()).update(p.get("allowed_measurements") or ())
    return out


@router.get("/workers", response_class=HTMLResponse)
async def workers_page(request: Request, state: Console, who: Viewer = Depends(viewer),
                       service: GatewayService = Depends(get_service)) -> HTMLResponse:
    reg = service.registry
    # What each worker submitted in its signed heartbeats (nothing is fetched from a worker's address).
    attestations = [a for a in await service.enrolment.attestation_all() if who.sees(str(a.get("tenant")))]
    tenants = {w.tenant for w in reg.workers.values() if who.sees(w.tenant)}
    reference = await _reference_values(state.broker, request, tenants)
    rows = worker_rows(service, attestations, reference, who, time.time())
    return render(state, request, "workers.html", who, rows=rows, now=dt.datetime.now(dt.UTC),
                  broker=state.broker.configured)
