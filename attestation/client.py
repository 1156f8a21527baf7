"""Client-side verification: fetch a deployment's evidence, verify the hardware evidence itself,
pin the worker's key.

    pinned = verify_deployment("https://gateway", jwks, policy, evidence_trust=VerifierTrust(), api_key=KEY)
    # pinned[i].hpke_public_key is the key a Sealed-mode request is encrypted to.

The key broker's token corroborates (its signature, expiry and the evidence it was issued for must
match) but never suffices: the CPU report (and GPU reports) are verified against the pinned vendor
roots, REPORT_DATA is recomputed from the served runtime data, and the policy is appraised on what
the hardware signed. A token for a key the evidence does not bind is refused.
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
from attestation.verifier import AttestationResult, VerifierTrust, verify_bundle
from attestation.workload import WorkloadClaims


@dataclass(frozen=True)
class PinnedWorker:
    model: str
    version: str
    tee: str
    insecure: bool
    measurement: str
    hpke_public_key: bytes
    attestation: AttestationClaims  # the broker token's claims, parsed once (corroboration, expiry)
    hardware: AttestationResult  # what the CPU and GPU evidence say, verified here
    workload: WorkloadClaims  # tenant, model, version, model digest, promises: bound by REPORT_DATA


def verify_worker_evidence(bundle: EvidenceBundle, trust: VerifierTrust, policy: AppraisalPolicy,
                           now: dt.datetime) -> tuple[AttestationResult, WorkloadClaims]:
    """The hardware evidence on its own: signatures and chains to the pinned roots, TCB and collateral
    at `now`, REPORT_DATA recomputed from the runtime data (HPKE key, channel binding, GPU evidence,
    workload claims), then the policy appraised on the verified claims.

    The nonce is the key broker's (the client did not issue it), so it is taken from the runtime data;
    the HPKE and receipt keys it binds live only in the measured worker's memory, which is what a
    client needs. How recent the evidence is comes from the token it is served with."""
    result = verify_bundle(bundle, expected_nonce=bundle.runtime_data.nonce, now=now, trust=trust)
    appraise(result.token_claims(), policy)
    return result, WorkloadClaims.decode(bundle.runtime_data.workload)


def _corroborate(claims: AttestationClaims, bundle: EvidenceBundle, result: AttestationResult,
                 workload: WorkloadClaims) -> None:
    """The token must describe exactly the evidence served next to it, and what it verified."""
    if claims.evidence_digest != bundle.digest():
        raise FreshnessError("served evidence differs from the evidence the token was issued for")
    if claims.hpke_public_key != result.hpke_public_key.hex():
        raise FreshnessError("token binds a different worker key than the hardware evidence")
    if claims.measurement.lower() != result.cpu.measurement.hex():
        raise FreshnessError("token names another measurement than the hardware evidence")
    scope = claims.scope
    if scope is None or (scope.tenant, scope.model, scope.version) != (workload.tenant, workload.model,
                                                                       workload.version):
        raise TokenError("token was issued for another tenant, model or version than the evidence binds")


def verify_worker_document(doc: Mapping[str, Any], verifier: TokenVerifier, policy: AppraisalPolicy,
                           now: dt.datetime, *, evidence_trust: VerifierTrust) -> PinnedWorker:
    """One entry of /.well-known/attestation: the hardware evidence and the policy first, then the
    broker's token (signature, expiry) as corroboration."""
    if "token" not in doc or "evidence" not in doc:
        raise TokenError("worker serves no attestation")
    bundle = EvidenceBundle.from_json(doc["evidence"])
    result, workload = verify_worker_evidence(bundle, evidence_trust, policy, now)
    claims = verifier.verify_claims(str(doc["token"]), now)
    _corroborate(claims, bundle, result, workload)
    return PinnedWorker(
        model=workload.model, version=workload.version, tee=result.cpu.tee.value, insecure=result.insecure,
        measurement=result.cpu.measurement.hex(), hpke_public_key=result.hpke_public_key, attestation=claims,
        hardware=result, workload=workload,
    )


def verify_deployment(base_url: str, jwks: Mapping[str, Any], policy: AppraisalPolicy, *,
                      evidence_trust: VerifierTrust, issuer: str = "sealed-key-broker",
                      now: dt.datetime | None = None, http: httpx.Client | None = None,
                      api_key: str | None = None) -> list[PinnedWorker]:
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
    return [verify_worker_document(w, verifier, policy, moment, evidence_trust=evidence_trust)
            for w in doc.get("workers", [])]
