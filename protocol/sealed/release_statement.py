"""The worker's release statement: under which tenant-signed release policy it got its key.

At key release the broker hands the worker the tenant-signed release-policy envelope; the worker
checks the tenant's signature itself (enclave_worker/release_policy_check.py, with the policy-admin
key its measurement pins) before it uses the key. It then states, signed with its usage (receipt)
key, which its evidence binds through REPORT_DATA's channel binding:

    {"statement": {"v": 1, "tenant", "model", "version", "worker_key_id", "release_policy_id",
                   "release_policy_version", "release_policy_sha256", "admin_key_id", "data_key_id"},
     "signature": hex Ed25519 over DOMAIN || canonical JSON of "statement",
     "release_policy": the envelope as the broker handed it over}

`release_policy_sha256` is SHA-256 of the canonical JSON of the envelope's payload. A client that
pins the tenant's policy-admin key checks the envelope's signature itself, that the statement binds
that envelope, and that the policy names the worker's measurement (sealed_client/tenant_pin.py): a
second copy of the broker, or a publisher, cannot add a worker to the tenant's set.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

STATEMENT_VERSION = 1
DOMAIN = b"sealed-release-statement-v1\x00"
_FIELDS = frozenset({"v", "tenant", "model", "version", "worker_key_id", "release_policy_id",
                     "release_policy_version", "release_policy_sha256", "admin_key_id", "data_key_id"})
MAX_BYTES = 16384


class ReleaseStatementError(ValueError):
    """A release statement that is malformed, or not signed by the key a caller expects."""


def _canonical(obj: Mapping[str, Any]) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode()


def payload_sha256(envelope: Mapping[str, Any]) -> str:
    """SHA-256 (hex) of the canonical JSON of a release-policy envelope's payload."""
    payload = envelope.get("payload") if isinstance(envelope, Mapping) else None
    if not isinstance(payload, Mapping):
        raise ReleaseStatementError("the release policy envelope has no payload object")
    try:
        return hashlib.sha256(_canonical(payload)).hexdigest()
    except (TypeError, ValueError) as exc:
        raise ReleaseStatementError("the release policy payload is not canonical JSON") from exc


@dataclass(frozen=True)
class ReleaseStatement:
    tenant: str
    model: str
    version: str
    worker_key_id: str  # hex SHA-256 of the worker's HPKE key (protocol.sealed.key_id)
    release_policy_id: str
    release_policy_version: int
    release_policy_sha256: str
    admin_key_id: str  # the key id the envelope names as its signer
    data_key_id: str  # the package manifest's key id (the data key released)

    def fields(self) -> dict[str, Any]:
        return {"v": STATEMENT_VERSION, **vars(self)}


def sign_release_statement(statement: ReleaseStatement, envelope: Mapping[str, Any],
                           key: Ed25519PrivateKey) -> dict[str, Any]:
    fields = statement.fields()
    return {"statement": fields, "signature": key.sign(DOMAIN + _canonical(fields)).hex(),
            "release_policy": dict(envelope)}


def read_release_statement(doc: Any, signing_key: bytes) -> tuple[ReleaseStatement, Mapping[str, Any]]:
    """(statement, envelope) of a document signed by `signing_key` (raw Ed25519) whose statement binds
    the envelope beside it; ReleaseStatementError otherwise. The envelope's own signature is the
    caller's check."""
    if not isinstance(doc, Mapping) or set(doc) != {"statement", "signature", "release_policy"}:
        raise ReleaseStatementError("the release statement must have exactly statement, signature, release_policy")
    fields, envelope = doc["statement"], doc["release_policy"]
    if not isinstance(fields, Mapping) or set(fields) != _FIELDS or fields.get("v") != STATEMENT_VERSION:
        raise ReleaseStatementError("the release statement has unexpected fields or version")
    try:
        if len(_canonical(doc)) > MAX_BYTES:
            raise ReleaseStatementError("the release statement is too large")
        Ed25519PublicKey.from_public_bytes(signing_key).verify(bytes.fromhex(str(doc["signature"])),
                                                               DOMAIN + _canonical(fields))
    except (InvalidSignature, ValueError, TypeError) as exc:
        raise ReleaseStatementError("the release statement is not signed by the worker's attested receipt key") from exc
    version = fields["release_policy_version"]
    if type(version) is not int or version < 1:
        raise ReleaseStatementError("the release statement's policy version must be a positive int")
    if not all(isinstance(fields[k], str) for k in _FIELDS - {"v", "release_policy_version"}):
        raise ReleaseStatementError("the release statement's names must be strings")
    statement = ReleaseStatement(**{k: fields[k] for k in _FIELDS - {"v"}})
    if payload_sha256(envelope) != statement.release_policy_sha256:
        raise ReleaseStatementError("the release policy served is not the one the worker's statement binds "
                                    "(digest differs)")
    return statement, envelope
