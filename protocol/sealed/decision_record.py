"""Sealed decision records: what a worker's policy decided about a sealed request, for the tenant's eyes only.

For every sealed request it opens, a worker whose tenant's signed policy set names a
`decision_record_key` (X25519) writes exactly one record, decisions or none, so that a record's
presence says nothing: who wrote it (worker id, boot id), its place in that worker's sequence
(`seq`, 1, 2, 3, ... without gaps, so the tenant can tell when one was dropped), the request id,
and the in-enclave decisions (action, outcome, rule, policy; never content). The worker signs it
with its attested usage key, pads it to one fixed size and seals it to the tenant's key (HPKE base
mode, the request suite, its own `info`). The gateway relays it and audits it as an opaque entry:
it learns that a sealed request happened, which it knew, not what was decided about it.

```
wire      = 0x01 ‖ u64 seq ‖ enc (32 bytes) ‖ ciphertext           (always WIRE_BYTES)
aad       = "sealed-decision-record-v1\\0" ‖ u16 len ‖ tenant ‖ u16 len ‖ worker id ‖ u64 seq
plaintext = u32 len ‖ canonical JSON {"record": {...}, "signature": hex} ‖ zeros up to RECORD_BYTES
signature = Ed25519(usage key, "sealed-decision-record-v1\\0" ‖ canonical JSON of record)
```

`seq` is in the clear (and bound as associated data) so the gateway can store each record once.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from pyhpke import KEMKey, OpenError

from protocol.heartbeat import worker_id_for
from protocol.sealed.errors import DecisionRecordInvalid, SealedFormatError
from protocol.sealed.hpke import ENC_BYTES, SUITE
from protocol.sealed.padding import pad_fixed, unpad

VERSION = 1
RECORD_INFO = b"sealed-decision-record-v1"
_LABEL = b"sealed-decision-record-v1\x00"
RECORD_BYTES = 4096  # every record's plaintext, whatever it holds
_SEQ = struct.Struct(">Q")
WIRE_BYTES = 1 + _SEQ.size + ENC_BYTES + RECORD_BYTES + 16  # + the AES-GCM tag
RECORD_METADATA_KEY = "sealed-record-bin"  # SealedGenerate's gRPC trailer that carries the record
DECISION_FIELDS = ("request_id", "action", "decision", "rule", "policy_id", "policy_version", "at")


@dataclass(frozen=True)
class DecisionRecord:
    """One sealed request's record. `decisions` hold DECISION_FIELDS only; `omitted` counts the
    decisions that did not fit the fixed size (said, never silently lost)."""

    worker_id: str
    boot_id: str
    seq: int
    request_id: str
    tenant: str
    key_id: str
    model: str
    version: str
    at: float
    decisions: tuple[Mapping[str, Any], ...] = ()
    omitted: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"v": VERSION, "worker_id": self.worker_id, "boot_id": self.boot_id, "seq": self.seq,
                "request_id": self.request_id, "tenant": self.tenant, "key_id": self.key_id, "model": self.model,
                "version": self.version, "at": self.at, "omitted": self.omitted,
                "decisions": [{k: d[k] for k in DECISION_FIELDS} for d in self.decisions]}

    @classmethod
    def from_dict(cls, doc: Any) -> DecisionRecord:
        try:
            if doc["v"] != VERSION or not isinstance(doc["decisions"], list):
                raise DecisionRecordInvalid("not a version-1 decision record")
            decisions = tuple({k: d[k] for k in DECISION_FIELDS} for d in doc["decisions"])
            return cls(str(doc["worker_id"]), str(doc["boot_id"]), int(doc["seq"]), str(doc["request_id"]),
                       str(doc["tenant"]), str(doc["key_id"]), str(doc["model"]), str(doc["version"]),
                       float(doc["at"]), decisions, int(doc["omitted"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise DecisionRecordInvalid(f"malformed decision record ({type(exc).__name__})") from exc


def _canonical(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode()


def _aad(tenant: str, worker_id: str, seq: int) -> bytes:
    out = bytearray(_LABEL)
    for value in (tenant, worker_id):
        raw = value.encode()[:0xFFFF]
        out += struct.pack(">H", len(raw)) + raw
    return bytes(out + _SEQ.pack(seq))


def _signed_document(record: DecisionRecord, usage_key: Ed25519PrivateKey) -> bytes:
    body = record.to_dict()
    return _canonical({"record": body, "signature": usage_key.sign(_LABEL + _canonical(body)).hex()})


def seal_decision_record(record: DecisionRecord, usage_key: Ed25519PrivateKey, tenant_key: bytes) -> bytes:
    """Worker side: sign, pad to RECORD_BYTES and seal to the tenant's X25519 public key (raw)."""
    if not 1 <= record.seq < 2**63:
        raise SealedFormatError("a decision record's seq starts at 1")
    document = _signed_document(record, usage_key)
    while len(document) + 4 > RECORD_BYTES and record.decisions:  # the last ones go; the count says so
        record = replace(record, decisions=record.decisions[:-1], omitted=record.omitted + 1)
        document = _signed_document(record, usage_key)
    recipient = KEMKey.from_pyca_cryptography_key(X25519PublicKey.from_public_bytes(tenant_key))
    enc, sender = SUITE.create_sender_context(recipient, info=RECORD_INFO)
    ciphertext = sender.seal(pad_fixed(document, RECORD_BYTES), aad=_aad(record.tenant, record.worker_id, record.seq))
    return bytes([VERSION]) + _SEQ.pack(record.seq) + enc + ciphertext


def record_seq(wire: bytes) -> int:
    """The gateway's view of a record: its sequence number, after checking version and size."""
    if len(wire) != WIRE_BYTES or wire[0] != VERSION:
        raise SealedFormatError("not a version-1 sealed decision record")
    (seq,) = _SEQ.unpack_from(wire, 1)
    return int(seq)


def open_decision_record(wire: bytes, tenant_private: X25519PrivateKey, *, tenant: str, worker_id: str,
                         worker_key: bytes) -> DecisionRecord:
    """Tenant side: open a record carried in an audit entry that names `worker_id` and its usage key
    `worker_key` (raw Ed25519); the key must be the worker id's, and must have signed the record."""
    try:
        seq = record_seq(wire)
    except SealedFormatError as exc:
        raise DecisionRecordInvalid(str(exc)) from exc
    if worker_id_for(worker_key) != worker_id:
        raise DecisionRecordInvalid("the worker key is not that worker id's")
    enc = wire[1 + _SEQ.size:1 + _SEQ.size + ENC_BYTES]
    try:
        recipient = SUITE.create_recipient_context(enc, KEMKey.from_pyca_cryptography_key(tenant_private),
                                                   info=RECORD_INFO)
        plaintext = recipient.open(wire[1 + _SEQ.size + ENC_BYTES:], aad=_aad(tenant, worker_id, seq))
        doc = json.loads(unpad(plaintext))
        body, signature = doc["record"], bytes.fromhex(doc["signature"])
        Ed25519PublicKey.from_public_bytes(worker_key).verify(signature, _LABEL + _canonical(body))
    except (OpenError, ValueError, KeyError, TypeError, SealedFormatError) as exc:
        raise DecisionRecordInvalid(f"record does not open under this key ({type(exc).__name__})") from exc
    except InvalidSignature as exc:
        raise DecisionRecordInvalid("record is not signed by that worker") from exc
    record = DecisionRecord.from_dict(body)
    if (record.worker_id, record.seq, record.tenant) != (worker_id, seq, tenant):
        raise DecisionRecordInvalid("record names another worker, seq or tenant than the entry carrying it")
    return record
