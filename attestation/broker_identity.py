"""Verify the key broker's attestation: its identity document, bound by hardware evidence.

A relying party (a worker before it trusts a key, a receipt or a lease answer; `sealed verify
--broker`) sends a fresh nonce to `POST /v1/broker/attestation` and checks the answer here:

1. the identity document parses (protocol/broker/identity.py), and the bundle's runtime data is the one
   recomputed from that document and the caller's nonce (never taken from the bundle);
2. the evidence verifies (attestation.verifier: signature or chain to pinned roots, TCB, REPORT_DATA
   binding the nonce, the import key and the identity digest); no GPU evidence;
3. the hardware says what the document says (TEE), debug is off, and the measurement is one the
   relying party pins. A simulated broker is accepted only where the verifier holds a simulated
   platform key, i.e. only by relying parties that accept the simulated TEE at all.

The result carries the broker's attested public keys: the token JWKS, the receipt key, the import key.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from attestation.bundle import EvidenceBundle
from attestation.claims import CpuClaims
from attestation.errors import BrokerIdentityError, FreshnessError, ParseError
from attestation.verifier import VerifierTrust, verify_bundle
from protocol.broker.identity import BrokerIdentity, BrokerIdentityInvalid, broker_runtime_data


@dataclass(frozen=True)
class VerifiedBroker:
    identity: BrokerIdentity
    cpu: CpuClaims
    evidence_digest: str

    @property
    def receipt_key(self) -> Ed25519PublicKey:
        return Ed25519PublicKey.from_public_bytes(self.identity.receipt_key)

    @property
    def measurement(self) -> str:
        return self.cpu.measurement.hex()


def verify_broker_attestation(answer: Mapping[str, Any], *, nonce: bytes, now: dt.datetime, trust: VerifierTrust,
                              allowed_measurements: Collection[str]) -> VerifiedBroker:
    """The broker's identity, if its evidence verifies and binds it; else an AttestationError."""
    if not allowed_measurements:
        raise BrokerIdentityError("no key broker measurement is pinned: the broker cannot be authenticated")
    try:
        identity = BrokerIdentity.from_json(answer.get("identity"))
    except (BrokerIdentityInvalid, AttributeError) as exc:
        raise ParseError(f"broker identity document: {exc}") from exc
    bundle = EvidenceBundle.from_json(answer.get("evidence"))
    if bundle.gpus or bundle.runtime_data.workload:
        raise ParseError("a key broker's evidence carries no GPU evidence and no workload claims")
    if bundle.runtime_data != broker_runtime_data(identity, nonce):
        raise FreshnessError("the broker's evidence binds another nonce, import key or identity document")
    result = verify_bundle(bundle, expected_nonce=nonce, now=now, trust=trust)
    if result.cpu.tee.value != identity.tee:
        raise BrokerIdentityError(f"the broker's identity says {identity.tee}, its evidence {result.cpu.tee.value}")
    if result.cpu.debug:
        raise BrokerIdentityError("the key broker runs in a debug TEE")
    measurement = result.cpu.measurement.hex()
    if measurement not in {m.lower() for m in allowed_measurements}:
        raise BrokerIdentityError(f"key broker measurement {measurement[:16]}... is not a pinned one")
    return VerifiedBroker(identity, result.cpu, result.evidence_digest)
