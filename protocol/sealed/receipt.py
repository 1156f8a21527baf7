"""Receipts: what the worker signs, with its attested Ed25519 key, for every sealed answer.

The receipt is the plaintext of the response's final chunk:
    {"receipt": {...fields below...}, "signature": hex Ed25519 over canonical JSON of "receipt"}
The signing key is the worker's usage-signing key, which its evidence binds (REPORT_DATA's channel
binding), so a client that verified the deployment knows the key.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from protocol.sealed.errors import ReceiptInvalid

RECEIPT_VERSION = 1


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
    version: int = RECEIPT_VERSION

    def fields(self) -> dict[str, Any]:
        # Every field is a str, int, float or bool: a shallow copy (dataclasses.asdict deep-copies each
        # field, which was most of the Python time of signing and checking a receipt).
        return dict(vars(self))

    def canonical(self) -> bytes:
        return json.dumps(self.fields(), sort_keys=True, separators=(",", ":")).encode()


def sign_receipt(receipt: Receipt, key: Ed25519PrivateKey) -> bytes:
    """The final chunk's plaintext."""
    return json.dumps({"receipt": receipt.fields(), "signature": key.sign(receipt.canonical()).hex()},
                      sort_keys=True, separators=(",", ":")).encode()


def verify_receipt(final_chunk: bytes, signer: bytes, *, request_sha256: str, response_sha256: str,
                   worker_key_id: str, model: str) -> Receipt:
    """Check the signature with the attested key, then that it describes exactly this exchange."""
    try:
        doc: Any = json.loads(final_chunk)
        receipt = Receipt(**doc["receipt"])
        signature = bytes.fromhex(doc["signature"])
    except (ValueError, KeyError, TypeError, RecursionError) as exc:  # RecursionError: deep nesting
        raise ReceiptInvalid("the response carries no well-formed receipt") from exc
    try:
        Ed25519PublicKey.from_public_bytes(signer).verify(signature, receipt.canonical())
    except (InvalidSignature, ValueError) as exc:
        raise ReceiptInvalid("receipt is not signed by the attested worker key") from exc
    mismatches = [name for name, want, got in (
        ("version", RECEIPT_VERSION, receipt.version), ("request", request_sha256, receipt.request_sha256),
        ("response", response_sha256, receipt.response_sha256), ("worker key", worker_key_id, receipt.worker_key_id),
        ("model", model, receipt.model)) if want != got]
    if mismatches:
        raise ReceiptInvalid(f"receipt does not match this exchange: {', '.join(mismatches)}")
    return receipt
