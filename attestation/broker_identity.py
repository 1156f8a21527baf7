"""Verify the key broker's attestation: its identity document, bound by hardware evidence.

A relying party (a worker before it trusts a key, a receipt or a lease answer; `sealed verify
--broker`) sends a fresh nonce to `POST /v1/broker/attestation` and checks the answer here:

1. the identity document parses (protocol/broker/identity.py), and the bundle's runtime data is the one
   recomputed from that document and the caller's nonce (never taken from the bundle);
2. the evidence verifies (attestation.verifier: signature or chain to pinned roots, TCB, REPORT_DATA
   binding the nonce, the import key and the identity digest); no GPU evidence;
3. the hardware says what the document says (TEE), debug is off, and the measurement is one the
   relying party pins. A simulated broker is accepted only where the verifier holds a simulated
   platform key, i.e. only by relying parties that accept the simulated TEE at all;
4. where the relying party pins workload ids, the digest of the broker's init-data its hardware
   reports (SNP HOST_DATA, TDX MRCONFIGID: attestation/broker_initdata.py, which names the broker
   image, its arguments, environment and measured configuration) is one of them. A launch digest
   names only the runtime class's firmware; the workload id names the broker. Pinned, it is
   required: a report without init-data (all zeros) or with another is refused. The simulated
   TEE has no such field: a simulated broker cannot satisfy a workload-id pin.
5. where the relying party pins broker instances (issue #46), the identity's instance key is one of
   them. A broker initialised afresh (`--init`: its state rolled back or lost) or a second copy of the
   build has another instance key, generated inside it: the same measurement, refused.

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
from attestation.initdata import workload_id_of
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

    @property
    def workload_id(self) -> str:
        """The init-data digest the broker's hardware reports (hex); "" on the simulated TEE."""
        return workload_id_of(self.cpu.tee.value, self.cpu.extra)


def verify_broker_attestation(answer: Mapping[str, Any], *, nonce: bytes, now: dt.datetime, trust: VerifierTrust,
                              allowed_measurements: Collection[str],
                              allowed_workload_ids: Collection[str] = (),
                              allowed_instances: Collection[str] = ()) -> VerifiedBroker:
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
    verified = VerifiedBroker(identity, result.cpu, result.evidence_digest)
    if allowed_workload_ids:
        workload_id = verified.workload_id
        if not workload_id.strip("0"):  # the simulated TEE has no field; a host that set none leaves zeros
            raise BrokerIdentityError(f"a key broker workload id is pinned, but the {identity.tee} broker's evidence "
                                      "carries no init-data")
        if workload_id not in {w.lower() for w in allowed_workload_ids}:
            raise BrokerIdentityError(f"key broker workload id {workload_id[:16]}... is not a pinned one: its "
                                      "init-data (image, arguments, configuration) is another")
    if allowed_instances and identity.instance_id not in {i.lower() for i in allowed_instances}:
        raise BrokerIdentityError(f"key broker instance {identity.instance_id[:16]}... is not the pinned one: a "
                                  "fresh broker (re-initialised, its earlier state lost or rolled back) or another "
                                  "copy of the build")
    return verified
