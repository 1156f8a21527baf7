"""What a client trusts (`ClientTrust`): its policy file, the appraisal policy, the key broker it
pins, the tenant and its keys, the reference-value publisher, and the floors it sets. How a worker's
attestation document becomes a pinned key under that trust is sealed_client/deployment.py."""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from attestation.appraisal import AppraisalPolicy
from attestation.collateral import CollateralConfig, CollateralStore
from attestation.errors import PolicyViolation
from attestation.sigstore_refvalues import SigstorePublisher
from attestation.verifier import VerifierTrust
from sealed_client.broker_pin import BrokerPin
from sealed_client.tenant_pin import parse_tenant_keys

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ClientTrust:
    """A client's policy: the appraisal policy, the key broker it trusts, what it requires of the worker.

    ``broker``: the key broker pinned by its hardware evidence (sealed_client/broker_pin.py): with its
    URL, the client asks the broker to attest itself and takes the token keys from the attested
    identity document. ``broker_jwks``: the key broker's token keys, pinned as a file instead. Without
    either, the client takes the gateway's `/.well-known/jwks.json` (trust on first use), only with
    ``unsafe_trust_gateway_jwks``.
    The token only corroborates: the client verifies the hardware evidence itself against the vendor
    roots pinned in `attestation/roots` (``unsafe_roots_dir`` replaces them: test PKIs), with the
    collateral (CRLs, TDX tcbInfo) of a local offline cache (``collateral_dir``), never the network.
    ``tenant``: the tenant this client's data belongs to; a worker of any other tenant is refused.
    ``tenant_keys``: the tenant's policy-admin public keys (key id -> key): a worker is accepted only if
    its key came under a release policy one of them signed, naming its image (tenant_pin.py); none
    only with ``unsafe_no_tenant_key`` (then any broker of the pinned build, and any publisher, can add
    a worker). ``state_file``: the client's memory of the newest policy versions, reference-value
    serial and revocation list seen (memory.py; must exist once named). ``revocations_file``: the
    tenant's signed revocation list (policy/revocations.py).
    """

    appraisal: AppraisalPolicy
    tenant: str = ""
    broker_jwks: Mapping[str, Any] | None = None
    broker: BrokerPin | None = None
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
    # Floors the tenant sets: the oldest reference-value statement (its `serial`) and the oldest
    # signed tenant policy set (the `policy_version` the evidence binds) this client accepts.
    min_reference_values_serial: int = 0
    min_policy_version: int = 0
    tenant_keys: Mapping[str, Ed25519PublicKey] = field(default_factory=dict)
    unsafe_no_tenant_key: bool = False
    state_file: Path | None = None
    revocations_file: Path | None = None

    def __post_init__(self) -> None:
        if not self.tenant:
            raise ValueError("the client policy names its tenant (`tenant`): a worker of another tenant is refused")
        if not self.tenant_keys and not self.unsafe_no_tenant_key:
            raise ValueError("the client policy pins the tenant's policy-admin key (`tenant_keys`: a worker is "
                             "accepted only under a release policy the tenant signed), or sets unsafe_no_tenant_key")
        if not self.tenant_keys:
            log.warning("UNSAFE: no tenant key pinned: any broker of the pinned build, and any publisher, can add "
                        "a worker this client accepts")
        if self.unsafe_roots_dir is not None:
            log.warning("UNSAFE: hardware vendor roots replaced by %s", self.unsafe_roots_dir)
        if self.reference_values_key is not None and self.reference_values_sigstore is not None:
            raise ValueError("pin one reference-value publisher: a key or a Sigstore identity, not both")
        if self.broker_jwks is None and not self.attests_broker and not self.unsafe_trust_gateway_jwks:
            raise ValueError("pin the key broker (broker: url, tee, measurements) or its JWKS (broker_jwks), "
                             "or set unsafe_trust_gateway_jwks")
        if self.broker_jwks is None and not self.attests_broker:
            log.warning("UNSAFE: trusting the key broker JWKS the gateway serves (trust on first use)")
        if self.min_reference_values_serial < 0 or self.min_policy_version < 0:
            raise ValueError("min_reference_values_serial and min_policy_version are non-negative")

    @functools.cached_property
    def evidence_trust(self) -> VerifierTrust:
        """What the client verifies hardware evidence with (attestation.verifier, as the key broker)."""
        sim = Ed25519PublicKey.from_public_bytes(self.sim_platform_key) if self.sim_platform_key else None
        snp = tdx = gpu = None
        if self.collateral_dir is not None:
            store = CollateralStore(CollateralConfig(self.collateral_dir, offline=True))
            snp, tdx, gpu = store.snp, store.tdx, store.nvidia
        return VerifierTrust(roots_dir=self.unsafe_roots_dir, sim_platform_key=sim, snp_fetcher=snp,
                             tdx_collateral=tdx, gpu_collateral=gpu)

    @property
    def attests_broker(self) -> bool:
        """The token keys come from the broker's own attested identity (no JWKS file pinned)."""
        return self.broker_jwks is None and self.broker is not None and self.broker.url is not None

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
        """`{"tenant": "...", "tenant_keys": [{"key_id", "public_key_pem"}], "state_file": "client-state.json",
        "revocations": "revocations.json", "appraisal": {...AppraisalPolicy...},
        "broker": {"url", "tee", "measurements"},
        "broker_jwks": {...}, "broker_issuer": "...",
        "require_promises": {...}, "min_policy_version": 0, "unsafe_trust_gateway_jwks": false,
        "reference_values": {...}, "evidence": {"sim_platform_key": "<hex>", "collateral_dir": path,
        "unsafe_roots_dir": path}}`.

        `reference_values`: `{"publisher_key": "<hex>"}` (or `{"publisher": {"key": "<hex>"}}`), or
        `{"publisher": {"sigstore": {"identity": ..., "issuer": ..., "trusted_root": "production" | path}}}`
        (a relative path is taken from the policy file's folder); `"min_serial": N` refuses statements
        older than serial N."""
        unknown = set(doc) - {"tenant", "appraisal", "broker_jwks", "broker_issuer", "require_promises",
                              "unsafe_trust_gateway_jwks", "reference_values", "evidence", "min_policy_version",
                              "broker", "tenant_keys", "unsafe_no_tenant_key", "state_file", "revocations"}
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
        if set(refs) - {"publisher_key", "publisher", "min_serial"} or set(pinned) - {"key", "sigstore"}:
            raise PolicyViolation([f"unknown reference_values keys: {sorted(set(refs) | set(pinned))}"])
        publisher = refs.get("publisher_key") or pinned.get("key")
        sigstore = pinned.get("sigstore")
        broker = BrokerPin.from_dict(doc["broker"]) if doc.get("broker") else None
        tenant_keys = parse_tenant_keys(doc["tenant_keys"]) if doc.get("tenant_keys") is not None else {}
        return cls(tenant_keys=tenant_keys, unsafe_no_tenant_key=bool(doc.get("unsafe_no_tenant_key", False)),
                   state_file=folder / str(doc["state_file"]) if doc.get("state_file") else None,
                   revocations_file=folder / str(doc["revocations"]) if doc.get("revocations") else None,
                   appraisal=AppraisalPolicy.from_dict(appraisal), broker_jwks=doc.get("broker_jwks"), broker=broker,
                   tenant=str(doc.get("tenant") or ""),
                   sim_platform_key=bytes.fromhex(sim_key) if sim_key else None,
                   unsafe_roots_dir=folder / evidence["unsafe_roots_dir"] if evidence.get("unsafe_roots_dir") else None,
                   collateral_dir=folder / evidence["collateral_dir"] if evidence.get("collateral_dir") else None,
                   reference_values_key=bytes.fromhex(publisher) if publisher else None,
                   reference_values_sigstore=SigstorePublisher.from_dict(sigstore, base) if sigstore else None,
                   broker_issuer=str(doc.get("broker_issuer", "sealed-key-broker")),
                   require_promises=dict(doc.get("require_promises") or {}),
                   unsafe_trust_gateway_jwks=bool(doc.get("unsafe_trust_gateway_jwks", False)),
                   min_reference_values_serial=_count(refs.get("min_serial", 0), "reference_values.min_serial"),
                   min_policy_version=_count(doc.get("min_policy_version", 0), "min_policy_version"))

    @classmethod
    def load(cls, path: str | Path, *, unsafe_allow_simulated: bool = False) -> ClientTrust:
        return cls.from_dict(json.loads(Path(path).read_text()), unsafe_allow_simulated=unsafe_allow_simulated,
                             base=Path(path).parent)


def _count(value: Any, name: str) -> int:
    if type(value) is not int or value < 0:
        raise PolicyViolation([f"{name} must be a non-negative integer"])
    return value
