"""Checking a sealed answer's receipt as a third party: with the signed receipt and evidence only.

A client keeps each answer's signed receipt (`AnswerReader.signed_receipt`, the `Sealed-Receipt`
header: base64 of `{"receipt": ..., "signature": ...}`). Someone who was not party to the exchange
(an auditor, the tenant) checks it with the evidence it names:

    receipt = verify_receipt_with_evidence(signed, evidence_bundle_json, trust, now)

1. the signature verifies with the key the receipt names (`signing_key`);
2. the evidence verifies as the client verifies it (hardware signature and chain to the pinned
   roots, REPORT_DATA recomputed, the trust's appraisal policy);
3. the evidence binds that key: its channel binding is SHA-256 over the receipt's `channel_spki` and
   `signing_key`; and its HPKE key is the receipt's `worker_key_id`;
4. the workload claims the evidence binds are the receipt's tenant, model, version, model digest and
   policy version.

Any bundle of the same worker binds the same keys; `evidence_sha256` names the one the worker served
when it signed, and only that one is accepted when `exact_evidence` is set.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

from attestation.bundle import EvidenceBundle, channel_binding
from attestation.client import verify_worker_evidence
from protocol.sealed import Receipt, ReceiptInvalid, key_id
from protocol.sealed.receipt import check_receipt_fields, read_signed_receipt
from sealed_client.trust import ClientTrust


def verify_receipt_with_evidence(signed: bytes, evidence: Mapping[str, Any], trust: ClientTrust, now: dt.datetime,
                                 *, exact_evidence: bool = False) -> Receipt:
    """The receipt, once its signature, its key's binding by verified evidence and the claims that
    evidence binds all check out; ReceiptInvalid (or the evidence's AttestationError) otherwise."""
    receipt = read_signed_receipt(signed)
    bundle = EvidenceBundle.from_json(dict(evidence))
    if exact_evidence and bundle.digest() != receipt.evidence_sha256:
        raise ReceiptInvalid("the evidence is not the one the receipt names")
    result, workload = verify_worker_evidence(bundle, trust.evidence_trust, trust.appraisal, now)
    try:
        spki = bytes.fromhex(receipt.channel_spki)
    except ValueError as exc:
        raise ReceiptInvalid("the receipt's channel key is not hex") from exc
    if channel_binding(spki, bytes.fromhex(receipt.signing_key)) != result.channel_binding:
        raise ReceiptInvalid("the evidence does not bind the key that signed the receipt")
    if key_id(result.hpke_public_key) != receipt.worker_key_id:
        raise ReceiptInvalid("the evidence binds another worker key than the receipt names")
    check_receipt_fields(receipt, {"tenant": workload.tenant, "model": workload.model,
                                   "model_version": workload.version, "model_digest": workload.model_digest,
                                   "policy_version": workload.policy_version})
    return receipt
