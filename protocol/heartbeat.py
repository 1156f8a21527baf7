"""Worker heartbeats: signed by the worker's attested identity key (wire contract, worker <-> gateway).

A worker's id is derived from its usage-signing public key, the key its attestation binds (with its
TLS key) through the channel binding in REPORT_DATA. Every heartbeat is signed with that key over
every field, and carries a sequence number that grows and the worker's clock, so one worker cannot
speak for another, and a captured heartbeat cannot be replayed to undo a newer one.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

HEARTBEAT_DOMAIN = b"sealed-heartbeat-v1\x00"


def worker_id_for(usage_public_key: bytes) -> str:
    """The only worker id a given identity key may use."""
    return "w-" + hashlib.sha256(b"sealed-worker-id-v1\x00" + usage_public_key).hexdigest()[:24]


def heartbeat_signing_input(body: dict[str, Any]) -> bytes:
    """What the identity key signs: every field but the signature, as canonical JSON."""
    fields = {k: v for k, v in body.items() if k != "signature"}
    return HEARTBEAT_DOMAIN + json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()
