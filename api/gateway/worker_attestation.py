"""Before routing to a worker: its mTLS certificate key and usage-signing key must be the ones its
attestation token binds (REPORT_DATA covers them), and the token must come from our key broker.

So a process that merely knows the registration token cannot stand in for an attested worker.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from attestation.bundle import channel_binding
from attestation.errors import FreshnessError, TokenError
from attestation.token import TokenVerifier


def load_verifier(jwks_file: Path, issuer: str) -> TokenVerifier:
    return TokenVerifier(json.loads(jwks_file.read_text()), issuer)


def expected_binding(tls_cert_pem: str, usage_public_key_hex: str) -> bytes:
    spki = b""
    if tls_cert_pem:
        spki = x509.load_pem_x509_certificate(tls_cert_pem.encode()).public_key().public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return channel_binding(spki, bytes.fromhex(usage_public_key_hex))


def verify_worker(http_url: str, *, tenant: str, model: str, version: str, tls_cert: str,
                  usage_public_key: str, verifier: TokenVerifier, client: httpx.Client | None = None) -> None:
    """Raise unless the worker's served token is ours, for this model, and binds these channel keys."""
    http = client or httpx.Client(timeout=5.0)
    try:
        doc = http.get(f"{http_url}/internal/attestation").json()
    finally:
        if client is None:
            http.close()
    # The signature is checked in full; the time is the token's own (a worker outlives its token).
    claims = verifier.verify_as_issued(str(doc.get("token", "")))
    try:
        claims.require_scope(tenant, model, version)
    except TokenError as exc:
        raise TokenError("worker's attestation is for another tenant, model or version") from exc
    if claims.channel_binding != expected_binding(tls_cert, usage_public_key).hex():
        raise FreshnessError("worker's TLS or usage key is not the one its attestation binds")
