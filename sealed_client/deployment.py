"""What a client trusts and how one worker's attestation document becomes a pinned sealing key."""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from attestation.appraisal import AppraisalPolicy
from attestation.bundle import EvidenceBundle, channel_binding
from attestation.client import PinnedWorker, verify_worker_document
from attestation.collateral import CollateralConfig, CollateralStore
from attestation.errors import FreshnessError, PolicyViolation
from attestation.refvalues import ReferenceValues, ReferenceValuesError, verify_reference_values
from attestation.sigstore_refvalues import SigstorePublisher, is_sigstore_bundle, verify_sigstore_reference_values
from attestation.token import TokenVerifier
from attestation.verifier import VerifierTrust
from protocol.sealed import key_id

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ClientTrust:
    """A client's policy: the appraisal policy, the key broker it trusts, what it requires of the worker.

    ``broker_jwks``: the key broker's token keys, pinned by the client. Without them the client takes
    the gateway's `/.well-known/jwks.json` (trust on first use), only with ``unsafe_trust_gateway_jwks``.
    The token only corroborates: the client verifies the hardware evidence itself against the vendor
    roots pinned in `attestation/roots` (``unsafe_roots_dir`` replaces them: test PKIs), with the
    collateral (CRLs, TDX tcbInfo) of a local offline cache (``collateral_dir``), never the network.
    ``tenant``: the tenant this client's data belongs to; a worker of any other tenant is refused.
    """

    appraisal: AppraisalPolicy
    tenant: str = ""
    broker_jwks: Mapping[str, Any] | None = None
    broker_issuer: str = "sealed-key-broker"
    require_promises: Mapping[str, Any] = field(default_factory=dict)
    unsafe_trust_gateway_jwks: bool = False
    # The operator's reference-value publisher, pinned by identity: a raw Ed25519 key (DSSE envelope),
    # or a Sigstore identity (bundle). Measurements it publishes are allowed too.
    reference_values_key: bytes | None = None
    reference_values_sigstore: SigstorePublisher | None = None
    sim_platform_key: bytes | None = None  # raw Ed25519: the simulated TEE's "vendor" (a file of the operator's)
    unsafe_roots_dir: Path | None = None
    collateral_dir: Path | None = None

    def __post_init__(self) -> None:
        if not self.tenant:
            raise ValueError("the client policy names its tenant (`tenant`): a worker of another tenant is refused")
        if self.unsafe_roots_dir is not None:
            log.warning("UNSAFE: hardware vendor roots replaced by %s", self.unsafe_roots_dir)
        if self.reference_values_key is not None and self.reference_values_sigstore is not None:
            raise ValueError("pin one reference-value publisher: a key or a Sigstore identity, not both")
        if self.broker_jwks is None and not self.unsafe_trust_gateway_jwks:
            raise ValueError("pin the key broker's JWKS (broker_jwks), or set unsafe_trust_gateway_jwks")
        if self.broker_jwks is None:
            log.warning("UNSAFE: trusting the key broker JWKS the gateway serves (trust on first use)")

    @functools.cached_property
    def evidence_trust(self) -> VerifierTrust:
        """What the client verifies hardware evidence with (attestation.verifier, as the key broker)."""
        sim = Ed25519PublicKey.from_public_bytes(self.sim_platform_key) if self.sim_platform_key else None
        snp = tdx = None
        if self.collateral_dir is not None:
            store = CollateralStore(CollateralConfig(self.collateral_dir, offline=True))
            snp, tdx = store.snp, store.tdx
        return VerifierTrust(roots_dir=self.unsafe_roots_dir, sim_platform_key=sim, snp_fetcher=snp,
                             tdx_collateral=tdx)

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
        """`{"tenant": "...", "appraisal": {...AppraisalPolicy...}, "broker_jwks": {...}, "broker_issuer": "...",
        "require_promises": {...}, "unsafe_trust_gateway_jwks": false, "reference_values": {...},
        "evidence": {"sim_platform_key": "<hex>", "collateral_dir": path, "unsafe_roots_dir": path}}`.

        `reference_values`: `{"publisher_key": "<hex>"}` (or `{"publisher": {"key": "<hex>"}}`), or
        `{"publisher": {"sigstore": {"identity": ..., "issuer": ..., "trusted_root": "production" | path}}}`
        (a relative path is taken from the policy file's folder)."""
        unknown = set(doc) - {"tenant", "appraisal", "broker_jwks", "broker_issuer", "require_promises",
                              "unsafe_trust_gateway_jwks", "reference_values", "evidence",
                              "broker"}  # broker: {"tee", "measurements"}, for `sealed verify --broker`
        if unknown:
            raise PolicyViolation([f"unknown client policy keys: {sorted(unknown)}"])
        evidence = dict(doc.get("evidence") or {})
        if set(evidence) - {"sim_platform_key", "collateral_dir", "unsafe_roots_dir"}:
            raise PolicyViolation([f"unknown evidence keys: {sorted(evidence)}"])
        folder = base or Path()
        sim_key = evidence.get("sim_platform_key")
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
                   tenant=str(doc.get("tenant") or ""),
                   sim_platform_key=bytes.fromhex(sim_key) if sim_key else None,
                   unsafe_roots_dir=folder / evidence["unsafe_roots_dir"] if evidence.get("unsafe_roots_dir") else None,
                   collateral_dir=folder / evidence["collateral_dir"] if evidence.get("collateral_dir") else None,
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
    """One verified worker: the key requests are sealed to, and the key its receipts are signed with.
    Tenant, model, version, model digest and promises are the ones the hardware evidence binds; the
    pin lasts as long as the token that corroborated the evidence (`expired`)."""

    tenant: str
    model: str
    version: str
    worker_key_id: str
    hpke_public_key: bytes
    receipt_key: bytes  # raw Ed25519: the worker's usage-signing key, bound by its evidence
    worker: PinnedWorker
    promises: Mapping[str, Any]
    token_expires_at: int
    model_digest: str = ""

    def expired(self, now: dt.datetime) -> bool:
        return now.timestamp() >= self.token_expires_at


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
                           now: dt.datetime, published: ReferenceValues | None = None,
                           model: str | None = None) -> PinnedKey:
    """One entry of /.well-known/attestation: hardware evidence, appraisal and the token's
    corroboration (attestation.client), then what sealed mode relies on, each from the evidence:
    the tenant is the client's and the model the one asked for, the HPKE key is the one REPORT_DATA
    binds, the receipt key is bound by its channel binding, and the promises the client requires are
    among the ones REPORT_DATA binds (the `promises` served beside the evidence are not read)."""
    worker = verify_worker_document(doc, verifier, effective_appraisal(trust, published), now,
                                    evidence_trust=trust.evidence_trust)
    workload = worker.workload
    if workload.tenant != trust.tenant:
        raise PolicyViolation([f"the worker serves tenant {workload.tenant!r}; this client's policy is for "
                               f"tenant {trust.tenant!r}"])
    if model is not None and workload.model != model:
        raise PolicyViolation([f"the worker serves model {workload.model!r}, not {model!r}"])
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
    promises = workload.promises
    unmet = [k for k, v in trust.require_promises.items() if promises.get(k) != v]
    if unmet:
        raise PolicyViolation([f"the worker's evidence does not bind the promise {k}={trust.require_promises[k]!r}"
                               for k in unmet])
    return PinnedKey(tenant=workload.tenant, model=workload.model, version=workload.version,
                     worker_key_id=key_id(worker.hpke_public_key), hpke_public_key=worker.hpke_public_key,
                     receipt_key=receipt_key, worker=worker, promises=promises,
                     token_expires_at=worker.attestation.expires_at, model_digest=workload.model_digest)


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
