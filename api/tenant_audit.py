"""The tenant's own view of what workers decided about its sealed requests.

The gateway's audit log holds each sealed request's decision record as an opaque `sealed-record`
entry (`api/gateway/settlement.py`). Only the tenant's decision-record private key (the X25519 key
whose public half its signed policy set names, `decision_record_key`) opens them. Each record must
also be signed by the worker the entry names (its usage key, whose hash is the worker id); with
`pinned_keys` (the usage keys `sealed verify` showed attested) a record from any other key is refused.
Records are numbered per worker process without gaps, so a missing number is a record the gateway
(or the path to it) dropped; duplicates (the same record delivered twice, or by two replicas)
count once.
"""

from __future__ import annotations

import base64
import binascii
from collections import defaultdict
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from policy.audit import read_entries
from protocol.sealed.decision_record import DecisionRecord, open_decision_record
from protocol.sealed.errors import DecisionRecordInvalid


@dataclass(frozen=True)
class InvalidRecord:
    log_seq: int  # the audit entry's position
    worker_id: str
    reason: str


@dataclass(frozen=True)
class Gap:
    worker_id: str
    boot_id: str
    missing: tuple[int, ...]


@dataclass(frozen=True)
class SealedDecisions:
    records: tuple[DecisionRecord, ...] = ()
    invalid: tuple[InvalidRecord, ...] = ()
    gaps: tuple[Gap, ...] = ()
    conflicts: tuple[tuple[str, int], ...] = field(default=())  # (worker id, seq) signed twice, differently


def load_decision_key(path: Path) -> X25519PrivateKey:
    key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    if not isinstance(key, X25519PrivateKey):
        raise ValueError(f"{path} is not an X25519 private key")
    return key


def decision_key_public_hex(key: X25519PrivateKey) -> str:
    return key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw).hex()


def read_sealed_decisions(audit_dir: Path, tenant: str, key: X25519PrivateKey,
                          pinned_keys: Collection[str] = ()) -> SealedDecisions:
    """Open every `sealed-record` entry of `tenant` in the audit directory; report what does not
    open or verify, sequence gaps per worker process, and records signed twice differently."""
    opened: dict[tuple[str, int], DecisionRecord] = {}
    invalid, conflicts = [], []
    for entry in read_entries(audit_dir, tenant=tenant):
        if entry.action != "sealed-record":
            continue
        meta = entry.metadata
        worker_id, worker_key = str(meta.get("worker_id", "")), str(meta.get("worker_key", ""))
        try:
            if pinned_keys and worker_key not in pinned_keys:
                raise DecisionRecordInvalid("signed by a worker key that is not pinned")
            record = open_decision_record(base64.b64decode(str(meta.get("sealed_record", "")), validate=True), key,
                                          tenant=tenant, worker_id=worker_id, worker_key=bytes.fromhex(worker_key))
        except (DecisionRecordInvalid, binascii.Error, ValueError) as exc:
            invalid.append(InvalidRecord(entry.seq, worker_id, str(exc)))
            continue
        known = opened.setdefault((worker_id, record.seq), record)
        if known != record:
            conflicts.append((worker_id, record.seq))
    return SealedDecisions(tuple(sorted(opened.values(), key=lambda r: (r.worker_id, r.seq))), tuple(invalid),
                           _gaps(opened.values()), tuple(conflicts))


def _gaps(records: Collection[DecisionRecord]) -> tuple[Gap, ...]:
    seqs: dict[tuple[str, str], set[int]] = defaultdict(set)
    for r in records:
        seqs[(r.worker_id, r.boot_id)].add(r.seq)
    out = []
    for (worker_id, boot_id), have in sorted(seqs.items()):
        missing = tuple(sorted(set(range(1, max(have) + 1)) - have))
        if missing:
            out.append(Gap(worker_id, boot_id, missing))
    return tuple(out)
