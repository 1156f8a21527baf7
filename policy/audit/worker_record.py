"""In-enclave policy decisions, signed by the worker and carried into the gateway's audit log.

The worker decides data and tool-use controls inside the trust boundary; the gateway, outside it,
must not be able to invent or drop such a decision unnoticed. So the worker signs each decision
record (what was decided, by which rule of which policy version, for which request; never
content) with its usage-signing key, the Ed25519 key bound into its attestation evidence
(REPORT_DATA). The record travels to the gateway (gRPC trailing metadata ``sealed-decision-bin``,
one per decision, on refusals and on successful answers alike), which checks the signature with
the key it pinned when it attested the worker and appends the decision to its own audit log
(action ``worker-decision``) with the worker's key and signature in the metadata, so an auditor
can re-verify every such entry on its own: ``verify_logged_decision(entry)``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from policy.audit.entry import AuditEntry

KIND = "sealed-worker-decision-v1"
_DOMAIN = b"sealed-worker-decision-v1\x00"
# Exactly these fields, all scalars: decisions and identifiers, never prompt or completion text.
FIELDS = ("request_id", "tenant", "key_id", "model", "version", "action", "decision", "rule",
          "policy_id", "policy_version", "at")
# "retrieval": a file whose passages a search gave the caller (rule: the file id, policy_id: the store id).
ACTIONS = frozenset({"admission", "content-input", "content-output", "tool-call", "retrieval"})
MAX_FIELD = 128
DECISION_METADATA_KEY = "sealed-decision-bin"  # gRPC trailing metadata (binary: "-bin" suffix)


class DecisionRecordError(ValueError):
    """A worker decision record is malformed or its signature does not verify."""


def _canonical(fields: Mapping[str, Any]) -> bytes:
    return json.dumps({"kind": KIND, **{k: fields[k] for k in FIELDS}}, sort_keys=True,
                      separators=(",", ":"), ensure_ascii=True).encode("ascii")


def _check(fields: Mapping[str, Any]) -> dict[str, Any]:
    if set(fields) != set(FIELDS):
        raise DecisionRecordError(f"decision record fields {sorted(set(fields) ^ set(FIELDS))} unexpected or missing")
    out = dict(fields)
    for k in FIELDS:
        v = out[k]
        if k == "policy_version":
            if type(v) is not int:
                raise DecisionRecordError("policy_version must be an int")
        elif k == "at":
            # Finite: the audit log's canonical encoder refuses NaN and infinities.
            if not isinstance(v, int | float) or isinstance(v, bool) or not math.isfinite(v):
                raise DecisionRecordError("at must be a finite number")
        elif not isinstance(v, str) or len(v) > MAX_FIELD or "\n" in v:
            raise DecisionRecordError(f"{k} must be a short string")
    if out["action"] not in ACTIONS:
        raise DecisionRecordError("unknown decision action")
    return out


def sign_decision(key: Ed25519PrivateKey, **fields: Any) -> tuple[bytes, bytes]:
    """(payload, signature) of one decision; done inside the enclave with the attested key."""
    payload = _canonical(_check(fields))
    return payload, key.sign(_DOMAIN + payload)


def verify_decision(payload: bytes, signature: bytes, public_key: bytes) -> dict[str, Any]:
    """The decision's fields if ``signature`` by ``public_key`` (raw Ed25519) verifies; raises."""
    try:
        Ed25519PublicKey.from_public_bytes(public_key).verify(signature, _DOMAIN + payload)
        raw = json.loads(payload)
    except (InvalidSignature, ValueError) as exc:
        raise DecisionRecordError("worker decision signature does not verify") from exc
    except RecursionError:  # signed, but nested past the JSON decoder's depth
        raise DecisionRecordError("not a worker decision record") from None
    if not isinstance(raw, dict) or raw.pop("kind", None) != KIND:
        raise DecisionRecordError("not a worker decision record")
    fields = _check(raw)
    if _canonical(fields) != payload:
        raise DecisionRecordError("worker decision record is not canonical")
    return fields


def logged_metadata(fields: Mapping[str, Any], signature: bytes, public_key: bytes) -> dict[str, Any]:
    """The audit metadata of a verified decision: with the entry's tenant and decision, everything
    needed to re-verify it later (so neither can be edited without breaking the worker's signature)."""
    return {**{k: fields[k] for k in FIELDS if k not in ("tenant", "action", "decision")},
            "worker_action": fields["action"],
            "worker_key": public_key.hex(), "worker_sig": signature.hex()}


def verify_logged_decision(entry: AuditEntry) -> dict[str, Any]:
    """Re-verify a ``worker-decision`` audit entry against the worker's own signature (an auditor
    does not have to trust the gateway that logged it). Returns the decision's fields; raises."""
    meta = dict(entry.metadata)
    try:
        fields = {**{k: meta[k] for k in FIELDS if k not in ("tenant", "action", "decision")},
                  "tenant": entry.tenant, "action": meta["worker_action"], "decision": entry.decision}
        return verify_decision(_canonical(_check(fields)), bytes.fromhex(str(meta["worker_sig"])),
                               bytes.fromhex(str(meta["worker_key"])))
    except (KeyError, ValueError) as exc:
        raise DecisionRecordError(f"not a verifiable worker decision entry: {exc}") from exc


def public_key_bytes(key: Ed25519PrivateKey) -> bytes:
    return key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
