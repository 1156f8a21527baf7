"""Client-side verification: fetch a deployment's evidence, verify it, pin the worker's key.

    pinned = verify_deployment("https://gateway", jwks, policy, issuer="sealed-key-broker", api_key=KEY)
    # pinned[i].hpke_public_key is the key a Sealed-mode request is encrypted to.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from attestation.appraisal import AppraisalPolicy, appraise
from attestation.bundle import EvidenceBundle
from attestation.errors import FreshnessError, TokenError
from attestation.token import AttestationClaims, TokenVerifier


@dataclass(frozen=True)
class PinnedWorker:
    model: str
    version: str
    tee: str
    insecure: bool
    measurement: str
    hpke_public_key: bytes
    attestation: AttestationClaims  # the broker token's claims, parsed once


def verify_worker_document(doc: Mapping[str, Any], verifier: TokenVerifier, policy: AppraisalPolicy,
                           now: dt.datetime) -> PinnedWorker:
    """One entry of /.well-known/attestation: token signature, evidence match, then the policy."""
    if "token" not in doc or "evidence" not in doc:
        raise TokenError("worker serves no attestation")
    claims = verifier.verify_claims(str(doc["token"]), now)
    bundle = EvidenceBundle.from_json(doc["evidence"])
    # The token must describe exactly the evidence served next to it.
    if claims.evidence_digest != bundle.digest():
        raise FreshnessError("served evidence differs from the evidence the token was issued for")
    if claims.hpke_public_key != bundle.runtime_data.hpke_public_key.hex():
        raise FreshnessError("token binds a different worker key")
    appraise(claims, policy)
    return PinnedWorker(
        model=str(doc.get("model")), version=str(doc.get("version")), tee=claims.tee,
        insecure=claims.insecure, measurement=claims.measurement,
        hpke_public_key=bundle.runtime_data.hpke_public_key, attestation=claims,
    )


def verify_deployment(base_url: str, jwks: Mapping[str, Any], policy: AppraisalPolicy, *,
                      issuer: str = "sealed-key-broker", now: dt.datetime | None = None,
                      http: httpx.Client | None = None, api_key: str | None = None) -> list[PinnedWorker]:
    """Fetch /.well-known/attestation (with the API key: the gateway shows each tenant only its own
    workers) and return every worker that verifies; raise if none does."""
    client = http or httpx.Client(timeout=10.0)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        response = client.get(f"{base_url.rstrip('/')}/.well-known/attestation", headers=headers)
        response.raise_for_status()
        doc = response.json()
    finally:
        if http is None:
            client.close()
    verifier = TokenVerifier(jwks, issuer)
    moment = now or dt.datetime.now(dt.UTC)
    return [verify_worker_document(w, verifier, policy, moment) for w in doc.get("workers", [])]
