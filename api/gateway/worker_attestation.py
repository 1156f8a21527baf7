"""What the gateway checks about a worker before routing to it, from what the worker itself
submitted (the gateway never fetches a URL a worker names): the broker-signed attestation token is
ours, for this model, binds its mTLS key and identity key (REPORT_DATA covers them), and describes
exactly the evidence submitted beside it. That document is what /.well-known/attestation serves.
Its heartbeats' signatures: protocol/heartbeat.py `verify_heartbeat_signature`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from attestation.bundle import EvidenceBundle, channel_binding
from attestation.errors import FreshnessError, ParseError, TokenError
from attestation.token import TokenVerifier
from attestation.x509chain import BAD_DER
from protocol.model_ref import ModelRef
from protocol.sealed import SealedError, key_id


def load_verifier(jwks_file: Path, issuer: str) -> TokenVerifier:
    return TokenVerifier(json.loads(jwks_file.read_text()), issuer)


def expected_binding(tls_cert_pem: str, usage_public_key_hex: str) -> bytes:
    spki = b""
    try:
        if tls_cert_pem:
            spki = x509.load_pem_x509_certificate(tls_cert_pem.encode()).public_key().public_bytes(
                serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
        return channel_binding(spki, bytes.fromhex(usage_public_key_hex))
    except BAD_DER as exc:  # cryptography reads some fields only when asked (a bad version: InvalidVersion)
        raise FreshnessError(f"worker's TLS certificate or usage key cannot be read ({type(exc).__name__})") from None


def verify_worker_attestation(doc: Mapping[str, Any] | None, ref: ModelRef, *, tls_cert: str,
                              usage_public_key: str, verifier: TokenVerifier, sealed_key_id: str = "") -> None:
    """Raise unless the submitted token is ours, for this model, binds these channel keys, and
    describes exactly the submitted evidence; and the sealing key id the worker announces (and
    sealed requests are routed by) is the hash of the HPKE key the token binds."""
    if not doc:
        raise TokenError("worker submitted no attestation")
    # The signature is checked in full; the time is the token's own (a worker outlives its token).
    claims = verifier.verify_as_issued(str(doc.get("token") or ""))
    try:
        claims.require_scope(ref)
    except TokenError as exc:
        raise TokenError("worker's attestation is for another tenant, model or version") from exc
    if claims.channel_binding != expected_binding(tls_cert, usage_public_key).hex():
        raise FreshnessError("worker's TLS or usage key is not the one its attestation binds")
    try:
        bundle = EvidenceBundle.from_json(doc.get("evidence"))
    except ParseError as exc:
        raise FreshnessError("worker submitted malformed evidence") from exc
    if claims.evidence_digest != bundle.digest():
        raise FreshnessError("submitted evidence differs from the evidence the token was issued for")
    announced = {sealed_key_id, str(doc.get("sealed_key_id") or "")} - {""}
    if announced:
        try:
            bound_key = key_id(bytes.fromhex(claims.hpke_public_key))
        except (SealedError, ValueError) as exc:
            raise FreshnessError("worker's attestation binds no valid HPKE key") from exc
        if announced != {bound_key}:
            raise FreshnessError("worker's sealing key id is not the HPKE key its attestation binds")
