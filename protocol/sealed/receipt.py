"""Receipts: what the worker signs, with its attested Ed25519 key, for every sealed answer.

The receipt is the plaintext of the response's final chunk:
    {"receipt": {...fields below...}, "signature": hex Ed25519 over canonical JSON of "receipt"}
The signing key is the worker's usage-signing key, which its evidence binds (REPORT_DATA's channel
binding), so a client that verified the deployment knows the key.

Version 2 binds everything the request's associated data binds (tenant, model, version, worker key
id, API key id, policy version) and carries what a third party needs to check it without the
client: the signing key itself (`signing_key`), the worker's TLS public key that the channel
binding covers with it (`channel_spki`), and a reference to the evidence (`evidence_sha256`,
`EvidenceBundle.digest()` of the bundle the worker served when it signed). A third party verifies
that evidence (any bundle of the same worker binds the same keys), recomputes the channel binding
from the two keys, and checks the signature (`sealed_client.receipts.verify_receipt_with_evidence`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from protocol.sealed.errors import ReceiptInvalid

RECEIPT_VERSION = 2


@dataclass(frozen=True)
class Receipt:
    request_sha256: str  # SHA-256 of the request plaintext (timestamp || body)
    response_sha256: str  # response.ResponseHash over every non-final chunk
    worker_key_id: str
    tenant: str
    model: str
    model_version: str
    model_digest: str
    policy_version: int  # the tenant's signed policy set in force (0: none)
    prompt_tokens: int
    completion_tokens: int
    tee: str
    insecure: bool
    issued_at: float
    api_key_id: str  # the API key id the request was sealed with (and its per-key rules applied)
    signing_key: str  # hex raw Ed25519: the key that signs this receipt (bound by the evidence)
    channel_spki: str  # hex DER of the worker's TLS public key ("" without mTLS): the channel binding's other half
    evidence_sha256: str  # EvidenceBundle.digest() of the evidence the worker served when it signed
    version: int = RECEIPT_VERSION
    # The files a retrieval's passages came from (a sealed vector store search), sorted; empty, and then
    # absent from the signed fields, for every other answer (their receipts sign as they always did).
    file_ids: tuple[str, ...] = ()

    def fields(self) -> dict[str, Any]:
        # Every field is a str, int, float or bool (file_ids: a tuple of str): a shallow copy
        # (dataclasses.asdict deep-copies each field, most of the Python time of signing and checking).
        fields = dict(vars(self))
        if not self.file_ids:
            del fields["file_ids"]
        else:
            fields["file_ids"] = list(self.file_ids)
        return fields

    def canonical(self) -> bytes:
        return json.dumps(self.fields(), sort_keys=True, separators=(",", ":")).encode()


def sign_receipt(receipt: Receipt, key: Ed25519PrivateKey) -> bytes:
    """The final chunk's plaintext."""
    return json.dumps({"receipt": receipt.fields(), "signature": key.sign(receipt.canonical()).hex()},
                      sort_keys=True, separators=(",", ":")).encode()


def read_signed_receipt(signed: bytes) -> Receipt:
    """A signed receipt on its own (what a third party holds): well-formed, version 2, and signed by
    the key it names. Whether that key is an attested worker's is the caller's check."""
    try:
        doc: Any = json.loads(signed)
        fields = doc["receipt"]
        if not isinstance(fields, dict) or fields.get("version") != RECEIPT_VERSION:
            raise ReceiptInvalid(f"not a version-{RECEIPT_VERSION} receipt")
        file_ids = fields.get("file_ids", [])
        if not isinstance(file_ids, list) or not all(isinstance(i, str) for i in file_ids):
            raise ReceiptInvalid("the receipt's file_ids is not a list of ids")
        receipt = Receipt(**{**fields, "file_ids": tuple(file_ids)})
        signature = bytes.fromhex(doc["signature"])
        key = Ed25519PublicKey.from_public_bytes(bytes.fromhex(receipt.signing_key))
    except ReceiptInvalid:
        raise
    except (ValueError, KeyError, TypeError, RecursionError) as exc:  # RecursionError: deep nesting
        raise ReceiptInvalid("the response carries no well-formed receipt") from exc
    try:
        key.verify(signature, receipt.canonical())
    except InvalidSignature as exc:
        raise ReceiptInvalid("receipt is not signed by the key it names") from exc
    return receipt


def check_receipt_fields(receipt: Receipt, expected: Mapping[str, Any]) -> None:
    """Every expected field has its value, or ReceiptInvalid names the ones that differ."""
    fields = receipt.fields()
    mismatches = [name for name, want in expected.items() if fields.get(name) != want]
    if mismatches:
        raise ReceiptInvalid(f"receipt does not match this exchange: {', '.join(mismatches)}")


def verify_receipt(final_chunk: bytes, signer: bytes, *, request_sha256: str, response_sha256: str,
                   worker_key_id: str, model: str, **expected: Any) -> Receipt:
    """Check the signature with the attested key, then that it describes exactly this exchange:
    the hashes, the worker key, the model and every `expected` field (tenant, model_version,
    model_digest, api_key_id, policy_version, ...)."""
    receipt = read_signed_receipt(final_chunk)
    if receipt.signing_key != signer.hex():
        raise ReceiptInvalid("receipt is not signed by the attested worker key")
    check_receipt_fields(receipt, {"request_sha256": request_sha256, "response_sha256": response_sha256,
                                   "worker_key_id": worker_key_id, "model": model, **expected})
    return receipt
