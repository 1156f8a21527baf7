"""The key broker's signed receipts as a relying party reads them: each line of its receipt log is
`{"receipt": {...}, "signature": base64(Ed25519(canonical JSON of the receipt))}`.

The broker signs them (`key_broker.receipts.ReceiptBook`); the console and `sealed keys receipts`
verify them against the broker's published receipt key, with this module, never the broker's.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Mapping
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from protocol.broker.errors import BrokerClientError


class ReceiptInvalid(BrokerClientError):
    """A receipt does not verify under the broker's receipt key."""


def receipt_payload(body: Mapping[str, Any]) -> bytes:
    """The bytes the broker signs: the receipt as canonical JSON."""
    return json.dumps(dict(body), sort_keys=True, separators=(",", ":")).encode()


def verify_receipt(line: Mapping[str, Any], broker_key: Ed25519PublicKey) -> dict[str, Any]:
    """The receipt of one log line, if its signature verifies; else ReceiptInvalid."""
    try:
        body = line["receipt"]
        signature = base64.b64decode(line["signature"], validate=True)
        broker_key.verify(signature, receipt_payload(body))
    except (KeyError, TypeError, ValueError, InvalidSignature) as exc:
        raise ReceiptInvalid(f"receipt does not verify: {type(exc).__name__}") from exc
    return dict(body)


def check_release_receipt(line: Mapping[str, Any], broker_key: Ed25519PublicKey, *, sealed_key: bytes,
                          token_id: str, ref: Mapping[str, str]) -> dict[str, Any]:
    """A worker's check of the receipt that came with its data key, under the broker's attested
    receipt key: signed, for this tenant, model and version and this token, and covering exactly the
    sealed key received. Only then are its `signer` and `model_digest` the broker's word."""
    body = verify_receipt(line, broker_key)
    expected = {"tenant": ref["tenant"], "model": ref["model"], "version": ref["version"], "token_id": token_id,
                "sealed_key_sha256": hashlib.sha256(sealed_key).hexdigest()}
    wrong = sorted(k for k, v in expected.items() if body.get(k) != v)
    if wrong:
        raise ReceiptInvalid(f"the release receipt does not bind this release ({', '.join(wrong)})")
    if not isinstance(body.get("model_digest"), str) or not isinstance(body.get("signer"), str | None):
        raise ReceiptInvalid("the release receipt names no model digest")
    return body
