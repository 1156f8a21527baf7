"""The usage ledger as it is read: every row checked again against the signed record it was stored
with and the worker usage key that signed it, so a row written into the database behind the gateway
(no signature, a forged one, a key no attested worker registered, an edited count) is flagged and
never counted.

What the control plane can check here is only that a row is what some registered usage key signed:
whoever writes the database can also write a key of its own into `usage_keys`. The tenant closes
that on its own machine: `sealed usage --export` gives it the records with each key's attestation
document, and `sealed usage --verify` (sealed_client/ledger.py) checks that hardware evidence binds
each key, against the tenant's own client policy.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session, sessionmaker

from api.store.models import UsageKeyRow, UsageRow, utcnow
from protocol.usage_record import LEDGER_FORMAT, UsageRecordInvalid, check_usage_record

_FIELDS = ("request_id", "tenant", "key_id", "model", "version", "prompt_tokens", "completion_tokens")


@dataclass
class Ledger:
    summary: list[dict[str, Any]] = field(default_factory=list)  # per (tenant, key id): verified rows only
    flagged: list[dict[str, Any]] = field(default_factory=list)  # rows that failed, with the reason


def check_row(row: UsageRow, registered: set[str]) -> None:
    """Raise UsageRecordInvalid unless `row` is exactly what a registered usage key signed."""
    if not row.payload or not row.public_key:
        raise UsageRecordInvalid("usage row carries no signed record")
    if row.public_key not in registered:
        raise UsageRecordInvalid("usage row is signed by a key no attested worker registered")
    try:
        payload, signature = base64.b64decode(row.payload, validate=True), bytes.fromhex(row.signature)
        public_key = bytes.fromhex(row.public_key)
    except (binascii.Error, ValueError) as exc:
        raise UsageRecordInvalid("usage row's record, signature or key is not encoded as stored") from exc
    facts = check_usage_record(payload, signature, public_key)
    edited = [f for f in _FIELDS if getattr(facts, f) != getattr(row, f)]
    if edited or abs(facts.worker_seconds - row.worker_seconds) > 1e-6:
        raise UsageRecordInvalid(f"usage row differs from its signed record ({', '.join(edited) or 'worker_seconds'})")


def registered_usage_keys(session: Session) -> set[str]:
    return set(session.scalars(select(UsageKeyRow.public_key)))


def verified_rows(rows: list[UsageRow], registered: set[str]) -> list[UsageRow]:
    """The rows that pass `check_row` (for views that count rows one by one)."""
    out = []
    for row in rows:
        try:
            check_row(row, registered)
        except UsageRecordInvalid:
            continue
        out.append(row)
    return out


def read_ledger(sessions: sessionmaker[Session], tenant: str | None) -> Ledger:
    with sessions() as s:
        q = select(UsageRow).order_by(UsageRow.tenant, UsageRow.key_id, UsageRow.id)
        if tenant is not None:
            q = q.where(UsageRow.tenant == tenant)
        rows = list(s.scalars(q))
        registered = registered_usage_keys(s)
    return summarise(rows, registered)


def summarise(rows: Iterable[UsageRow], registered: set[str]) -> Ledger:
    ledger, sums = Ledger(), dict[tuple[str, str], dict[str, Any]]()
    for row in rows:
        try:
            check_row(row, registered)
        except UsageRecordInvalid as exc:
            ledger.flagged.append({"id": row.id, "tenant": row.tenant, "key_id": row.key_id,
                                   "request_id": row.request_id, "worker_id": row.worker_id,
                                   "prompt_tokens": row.prompt_tokens, "completion_tokens": row.completion_tokens,
                                   "reason": str(exc)})
            continue
        entry = sums.setdefault((row.tenant, row.key_id), {
            "tenant": row.tenant, "key_id": row.key_id, "requests": 0, "prompt_tokens": 0, "completion_tokens": 0,
            "worker_seconds": 0.0})
        entry["requests"] += 1
        entry["prompt_tokens"] += row.prompt_tokens
        entry["completion_tokens"] += row.completion_tokens
        entry["worker_seconds"] += row.worker_seconds
    ledger.summary = [sums[k] for k in sorted(sums)]
    return ledger


def remember_usage_key(sessions: sessionmaker[Session], public_key: str, tenant: str, worker_id: str,
                       document: dict[str, Any]) -> None:
    """Keep the attestation document of a usage key that signed a stored row (once per key)."""
    with sessions.begin() as s:  # two streams of one worker may end together: the first write wins
        insert = (postgresql.insert if s.get_bind().dialect.name == "postgresql" else sqlite.insert)(UsageKeyRow)
        s.execute(insert.values(public_key=public_key, tenant=tenant, worker_id=worker_id, document=document,
                                created_at=utcnow()).on_conflict_do_nothing(index_elements=["public_key"]))


def export_ledger(sessions: sessionmaker[Session], tenant: str) -> dict[str, Any]:
    """The tenant's whole ledger as the tenant checks it (`sealed usage --verify`): every row's signed
    record, signature and key, and each key's attestation document. Nothing here is trusted by the
    verifier; it is only what it needs."""
    with sessions() as s:
        rows = list(s.scalars(select(UsageRow).where(UsageRow.tenant == tenant).order_by(UsageRow.id)))
        keys = {k.public_key: k.document for k in s.scalars(select(UsageKeyRow).where(UsageKeyRow.tenant == tenant))}
    records = [{"payload": r.payload, "signature": r.signature, "public_key": r.public_key,
                "stored": {f: getattr(r, f) for f in (*_FIELDS, "worker_seconds", "worker_id")}} for r in rows]
    return {"format": LEDGER_FORMAT, "tenant": tenant, "records": records, "usage_keys": keys}
