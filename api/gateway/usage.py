"""Signed usage records: the worker signs, the gateway checks the signature and the facts, then stores."""

from __future__ import annotations

import json
import logging
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from api.errors import SealedApiError
from api.gateway.registry import WorkerInfo
from api.store.models import UsageRow
from protocol.rpc import worker_pb2

log = logging.getLogger(__name__)
MAX_COUNT = 2**53  # tokens and seconds of one request: stored as SQLite integers, summed as floats


class UsageRejected(SealedApiError):
    pass


def verify_usage(record: worker_pb2.UsageRecord, worker: WorkerInfo, request_id: str | None, tenant: str) -> UsageRow:
    """Check a record against the key the worker registered with and the request it answers
    (`request_id` None: a record the worker owed by heartbeat, which names its own request)."""
    if record.public_key.hex() != worker.usage_public_key:
        raise UsageRejected("usage record signed by a key the worker did not register")
    try:
        Ed25519PublicKey.from_public_bytes(record.public_key).verify(record.signature, record.payload)
    except (InvalidSignature, ValueError) as exc:
        raise UsageRejected("bad usage signature") from exc
    try:
        return _row(json.loads(record.payload), worker, request_id, tenant, record.signature.hex())
    except (ValueError, TypeError, KeyError, AttributeError, OverflowError, RecursionError) as exc:
        # Signed, but not a usage record as a worker writes it (enclave_worker/signing.py):
        # refused like a bad signature, never an error of the call that carried it.
        raise UsageRejected(f"malformed usage record ({type(exc).__name__})") from None


def _row(doc: dict[str, Any], worker: WorkerInfo, request_id: str | None, tenant: str, signature: str) -> UsageRow:
    if request_id is None:  # owed by heartbeat: the record names its request, which must be a real id
        named = doc.get("request_id")
        if not (isinstance(named, str) and 0 < len(named) <= 64):
            # A signed record with a null, missing or oversized id once reached the usage table as a
            # row without a request and failed its NOT NULL constraint: a 500 on the heartbeat.
            raise UsageRejected("usage record names no valid request id")
        request_id = named
    if doc.get("request_id") != request_id or doc.get("tenant") != tenant:
        raise UsageRejected("usage record is for another request")
    row = UsageRow(request_id=request_id, tenant=tenant, key_id=str(doc.get("key_id", "")),
                   model=str(doc["model"]), version=str(doc["version"]), worker_id=worker.worker_id,
                   prompt_tokens=int(doc["prompt_tokens"]), completion_tokens=int(doc["completion_tokens"]),
                   worker_seconds=float(doc["worker_seconds"]), signature=signature)
    counts = (row.prompt_tokens, row.completion_tokens)
    if not all(0 <= n < MAX_COUNT for n in counts) or not 0 <= row.worker_seconds < MAX_COUNT:
        raise UsageRejected("usage record counts are out of range")
    return row
