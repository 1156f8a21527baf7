"""Worker heartbeats: signed by the worker's attested identity key (wire contract, worker <-> gateway).

A worker's id is derived from its usage-signing public key, the key its attestation binds (with its
TLS key) through the channel binding in REPORT_DATA. Every heartbeat is signed with that key over
every field, and carries a sequence number that grows and the worker's clock, so one worker cannot
speak for another, and a captured heartbeat cannot be replayed to undo a newer one.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Mapping
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

HEARTBEAT_DOMAIN = b"sealed-heartbeat-v1\x00"
MAX_CLOCK_SKEW_S = 60


class HeartbeatRefused(Exception):
    """A heartbeat that is not signed by the identity it names, or stale."""


def worker_id_for(usage_public_key: bytes) -> str:
    """The only worker id a given identity key may use."""
    return "w-" + hashlib.sha256(b"sealed-worker-id-v1\x00" + usage_public_key).hexdigest()[:24]


def heartbeat_signing_input(body: dict[str, Any]) -> bytes:
    """What the identity key signs: every field but the signature, as canonical JSON."""
    fields = {k: v for k, v in body.items() if k != "signature"}
    return HEARTBEAT_DOMAIN + json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()


def verify_heartbeat_signature(body: Mapping[str, Any], now: float | None = None) -> None:
    """Raise HeartbeatRefused unless the heartbeat is signed by the key its worker id derives from,
    at a time within MAX_CLOCK_SKEW_S of ours (the receiver checks that the sequence grows)."""
    try:
        public = bytes.fromhex(str(body["usage_public_key"]))
        if body["worker_id"] != worker_id_for(public):
            raise HeartbeatRefused("worker id is not the one its identity key derives")
        Ed25519PublicKey.from_public_bytes(public).verify(bytes.fromhex(str(body["signature"])),
                                                          heartbeat_signing_input(dict(body)))
    except (InvalidSignature, KeyError, TypeError, ValueError) as exc:
        raise HeartbeatRefused("heartbeat is not signed by the worker's identity key") from exc
    if abs((time.time() if now is None else now) - int(body["at"])) > MAX_CLOCK_SKEW_S:
        raise HeartbeatRefused("heartbeat time is too far from the gateway's")
