"""A worker's signed usage record, as everyone who checks one reads it: the gateway when it writes
the row, the control plane when it reads the ledger back, and the tenant on its own machine
(`sealed usage --verify`).

The worker signs the canonical JSON of the record (enclave_worker/signing.py) with its usage key,
the Ed25519 key its attestation evidence binds (the channel binding in REPORT_DATA). A record is
good when that key's signature over the exact payload verifies and the payload is a usage record:
request id, tenant, key id, model, version, counts in range. Anything else raises
`UsageRecordInvalid` with a reason; a caller never gets a bool to forget.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

MAX_COUNT = 2**53  # tokens and seconds of one request: stored as SQLite integers, summed as floats
LEDGER_FORMAT = "sealed-usage-ledger-v1"  # the export `sealed usage --export` writes and --verify reads


class UsageRecordInvalid(Exception):
    """A usage record that is not the worker's: bad or missing signature, another key, bad fields."""


@dataclass(frozen=True)
class UsageFacts:
    """What a verified record says."""

    request_id: str
    tenant: str
    key_id: str
    model: str
    version: str
    prompt_tokens: int
    completion_tokens: int
    worker_seconds: float


def check_usage_record(payload: bytes, signature: bytes, public_key: bytes) -> UsageFacts:
    """The facts of a record `public_key` signed; UsageRecordInvalid otherwise."""
    if len(signature) != 64:
        raise UsageRecordInvalid("usage record has no Ed25519 signature")
    try:
        Ed25519PublicKey.from_public_bytes(public_key).verify(signature, payload)
    except (InvalidSignature, ValueError) as exc:
        raise UsageRecordInvalid("usage record signature does not verify with the worker's usage key") from exc
    try:
        return _facts(json.loads(payload))
    except (ValueError, TypeError, KeyError, AttributeError, OverflowError, RecursionError) as exc:
        # Signed, but not a usage record as a worker writes it: refused like a bad signature.
        raise UsageRecordInvalid(f"malformed usage record ({type(exc).__name__})") from None


def _facts(doc: dict[str, Any]) -> UsageFacts:
    request_id = doc.get("request_id")
    if not (isinstance(request_id, str) and 0 < len(request_id) <= 64):
        raise UsageRecordInvalid("usage record names no valid request id")
    tenant = doc["tenant"]
    if not isinstance(tenant, str):
        raise UsageRecordInvalid("usage record names no tenant")
    facts = UsageFacts(request_id=request_id, tenant=tenant, key_id=str(doc.get("key_id", "")),
                       model=str(doc["model"]), version=str(doc["version"]),
                       prompt_tokens=int(doc["prompt_tokens"]), completion_tokens=int(doc["completion_tokens"]),
                       worker_seconds=float(doc["worker_seconds"]))
    counts = (facts.prompt_tokens, facts.completion_tokens)
    if not all(0 <= n < MAX_COUNT for n in counts) or not 0 <= facts.worker_seconds < MAX_COUNT:
        raise UsageRecordInvalid("usage record counts are out of range")
    return facts
