"""What a client trusts and how one worker's attestation document becomes a pinned sealing key."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from attestation.appraisal import AppraisalPolicy
from attestation.bundle import EvidenceBundle, channel_binding
from attestation.client import PinnedWorker, verify_worker_document
from attestation.errors import FreshnessError, PolicyViolation
from attestation.refvalues import ReferenceValues, ReferenceValuesError, verify_reference_values
from attestation.sigstore_refvalues import SigstorePublisher, is_sigstore_bundle, verify_sigstore_reference_values
from attestation.token import TokenVerifier
from protocol.sealed import key_id

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ClientTrust:
    """A client's policy: the appraisal policy, the key broker it trusts, what it requires of the worker.

    ``broker_jwks``: the key broker's token keys, pinned by the client. Without them the client takes
    the gateway's `/.well-known/jwks.json` (trust on first use), only with ``unsafe_trust_gateway_jwks``.
    """

    appraisal: AppraisalPolicy
    broker_jwks: Mapping[str, Any] | None = None
    broker_issuer: str = "sealed-key-broker"
    require_promises: Mapping[str, Any] = field(default_factory=dict)
    unsafe_trust_gateway_jwks: bool = False
    # The operator's reference-value publisher, pinned by identity: a raw Ed25519 key (DSSE envelope),
    # or a Sigstore identity (bundle). Measurements it publishes are allowed too.
    reference_values_key: bytes | None = None
    reference_values_sigstore: SigstorePublisher | None = None

    def __post_init__(self) -> None:
        if self.reference_values_key is not None and self.reference_values_sigstore is not None:
            raise ValueError("pin one reference-value publisher: a key or a Sigstore identity, not both")
        if self.broker_jwks is None and not self.unsafe_trust_gateway_jwks:
            raise ValueError("pin the key broker's JWKS (broker_jwks), or set unsafe_trust_gateway_jwks")
        if self.broker_jwks is None:
            log.warning("UNSAFE: trusting the key broker JWKS the gateway serves (trust on first use)")

    @property
    def pins_publisher(self) -> bool:
        return self.reference_values_key is not None or self.reference_values_sigstore is not None

    @property
    def publisher(self) -> str:
        if self.reference_values_sigstore is not None:
            return self.reference_values_sigstore.describe()
        return f"ed25519 {self.reference_values_key.hex()}" if self.reference_values_key else "none"

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any], *, unsafe_allow_simulated: bool = False,
                  base: Path | None = None) -> ClientTrust:
        """`{"appraisal": {...AppraisalPolicy...}, "broker_jwks": {...}, "broker_issuer": "...",
        "require_promises": {...}, "unsafe_trust_gateway_jwks": false, "reference_values": {...}}`.

        `reference_values`: `{"publisher_key": "<hex>"}` (or `{"publisher": {"key": "<hex>"}}`), or
        `{"publisher": {"sigstore": {"identity": ..., "issuer": ..., "trusted_root": "production" | path}}}`
        (a relative path is taken from the policy file's folder)."""
        unknown = set(doc) - {"appraisal", "broker_jwks", "broker_issuer", "require_promises",
                              "unsafe_trust_gateway_jwks", "reference_values"}
        if unknown:
            raise PolicyViolation([f"unknown client policy keys: {sorted(unknown)}"])
        appraisal = dict(doc.get("appraisal") or {})
        if unsafe_allow_simulated:
            appraisal["unsafe_allow_simulated_tee"] = True
            appraisal["allowed_tee"] = sorted({*appraisal.get("allowed_tee", []), "sim"})
        refs = dict(doc.get("reference_values") or {})
        pinned = dict(refs.get("publisher") or {})
        if set(refs) - {"publisher_key", "publisher"} or set(pinned) - {"key", "sigstore"}:
            raise PolicyViolation([f"unknown reference_values keys: {sorted(set(refs) | set(pinned))}"])
        publisher = refs.get("publisher_key") or pinned.get("key")
        sigstore = pinned.get("sigstore")
        return cls(appraisal=AppraisalPolicy.from_dict(appraisal), broker_jwks=doc.get("broker_jwks"),
                   reference_values_key=bytes.fromhex(publisher) if publisher else None,
                   reference_values_sigstore=SigstorePublisher.from_dict(sigstore, base) if sigstore else None,
                   broker_issuer=str(doc.get("broker_issuer", "sealed-key-broker")),
                   require_promises=dict(doc.get("require_promises") or {}),
                   unsafe_trust_gateway_jwks=bool(doc.get("unsafe_trust_gateway_jwks", False)))

    @classmethod
    def load(cls, path: str | Path, *, unsafe_allow_simulated: bool = False) -> ClientTrust:
        return cls.from_dict(json.loads(Path(path).read_text()), unsafe_allow_simulated=unsafe_allow_simulated,
                             base=Path(path).parent)


@dataclass(frozen=True)
class PinnedKey:
    """One verified worker: the key requests are sealed to, and the key its receipts are signed with."""

    tenant: str
    model: str
    version: str
    worker_key_id: str
    hpke_public_key: bytes
    receipt_key: bytes  # raw Ed25519: the worker's usage-signing key, bound by its evidence
    worker: PinnedWorker
    promises: Mapping[str, Any]
    token_expires_at: int


def _spki(cert_pem: str | None) -> bytes:
    if not cert_pem:
        return b""
    cert = x509.load_pem_x509_certificate(cert_pem.encode())
    return cert.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)


def effective_appraisal(trust: ClientTrust, published: ReferenceValues | None) -> AppraisalPolicy:
    """The client's appraisal policy, its allowed measurements widened by the publisher's signed set."""
    if not trust.pins_publisher:
        return trust.appraisal
    if published is None:
        raise ReferenceValuesError("the client pins a reference-value publisher but none were published")
    return dataclasses.replace(trust.appraisal,
                               allowed_measurements=trust.appraisal.allowed_measurements | published.measurements)


def verify_sealed_document(doc: Mapping[str, Any], verifier: TokenVerifier, trust: ClientTrust,
                           now: dt.datetime, published: ReferenceValues | None = None) -> PinnedKey:
    """One entry of /.well-known/attestation: token, evidence, appraisal (attestation.client), then
    the sealed-mode keys: the HPKE key is the attested one, the receipt key is bound by the evidence's
    channel binding, and the worker's measured promises meet the client's requirements."""
    worker = verify_worker_document(doc, verifier, effective_appraisal(trust, published), now)
    bundle = EvidenceBundle.from_json(doc["evidence"])
    if str(doc.get("sealed_key_id", "")) != key_id(worker.hpke_public_key):
        raise FreshnessError("the worker announces a sealing key its evidence does not bind (key change "
                             "without re-attestation)")
    try:
        receipt_key = bytes.fromhex(str(doc["usage_public_key"]))
        binding = channel_binding(_spki(doc.get("grpc_tls_cert")), receipt_key)
    except (KeyError, ValueError) as exc:
        raise FreshnessError("the worker's receipt key is missing or malformed") from exc
    if binding != bundle.runtime_data.channel_binding:
        raise FreshnessError("the worker's receipt key is not the one its evidence binds")
    promises = doc.get("promises") or {}
    unmet = [k for k, v in trust.require_promises.items() if promises.get(k) != v]
    if unmet:
        raise PolicyViolation([f"worker does not promise {k}={trust.require_promises[k]!r}" for k in unmet])
    scope = worker.attestation.scope
    return PinnedKey(tenant=scope.tenant if scope else str(doc.get("tenant", "")),
                     model=scope.model if scope else str(doc.get("model", "")),
                     version=scope.version if scope else str(doc.get("version", "")),
                     worker_key_id=key_id(worker.hpke_public_key), hpke_public_key=worker.hpke_public_key,
                     receipt_key=receipt_key, worker=worker, promises=promises,
                     token_expires_at=worker.attestation.expires_at)


def verify_published(trust: ClientTrust, published: Mapping[str, Any] | None, now: dt.datetime
                     ) -> ReferenceValues | None:
    """The published reference values, verified as the client pinned their publisher: a Sigstore
    bundle for a Sigstore identity, a DSSE envelope for a key; the other form is refused."""
    if not trust.pins_publisher:
        return None
    if published is None:
        raise ReferenceValuesError("no reference values published")
    if trust.reference_values_sigstore is not None:
        if not is_sigstore_bundle(published):
            raise ReferenceValuesError("the client pins a Sigstore publisher but the reference values are "
                                       "not a Sigstore bundle")
        return verify_sigstore_reference_values(published, trust.reference_values_sigstore, now)
    if is_sigstore_bundle(published):
        raise ReferenceValuesError("the client pins a publisher key but the reference values are a Sigstore bundle")
    assert trust.reference_values_key is not None
    return verify_reference_values(published, trust.reference_values_key, now)
