"""Stored Responses state: ciphertext blobs by id, per tenant (models.ResponseStateRow).

The gateway keeps only what workers sealed; it cannot read them (enclave_worker/response_state.py).
Every read is scoped to the tenant: another tenant's id reads as absent, as an unknown one does.
An expired row reads as absent too, and `purge_expired` deletes it.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from dataclasses import dataclass

from sqlalchemy import delete, select
from sqlalchemy.orm import Session, sessionmaker

from api.store.models import ResponseStateRow, utcnow


@dataclass(frozen=True)
class StoredState:
    id: str
    tenant: str
    model: str
    version: str
    previous_id: str | None
    blob: bytes
    blob_sha256: str
    created_at: dt.datetime


def _state(row: ResponseStateRow) -> StoredState:
    return StoredState(row.id, row.tenant, row.model, row.version, row.previous_id, row.blob, row.blob_sha256,
                       row.created_at)


def _aware(when: dt.datetime) -> dt.datetime:
    return when if when.tzinfo is not None else when.replace(tzinfo=dt.UTC)  # SQLite drops the zone


class ResponseStates:
    def __init__(self, sessions: sessionmaker[Session]) -> None:
        self.sessions = sessions

    def put(self, *, state_id: str, tenant: str, model: str, version: str, previous_id: str | None, blob: bytes,
            retention: dt.timedelta, now: dt.datetime | None = None) -> StoredState:
        now = now or utcnow()
        row = ResponseStateRow(id=state_id, tenant=tenant, model=model, version=version, previous_id=previous_id,
                               blob=blob, blob_sha256=hashlib.sha256(blob).hexdigest(), created_at=now,
                               expires_at=now + retention)
        with self.sessions.begin() as s:
            s.add(row)
        return _state(row)

    def get(self, tenant: str, state_id: str, now: dt.datetime | None = None) -> StoredState | None:
        with self.sessions() as s:
            row = s.get(ResponseStateRow, state_id)
            if row is None or row.tenant != tenant or _aware(row.expires_at) <= (now or utcnow()):
                return None
            return _state(row)

    def chain(self, tenant: str, state_id: str, limit: int, now: dt.datetime | None = None
              ) -> list[StoredState] | None:
        """The state and those it continued from, oldest first; None if any link is gone (deleted,
        expired, another tenant's) or the chain is longer than `limit`."""
        out: list[StoredState] = []
        next_id: str | None = state_id
        while next_id is not None:
            state = self.get(tenant, next_id, now)
            if state is None or len(out) >= limit or any(s.id == state.id for s in out):
                return None
            out.append(state)
            next_id = state.previous_id
        return out[::-1]

    def delete(self, tenant: str, state_id: str) -> bool:
        with self.sessions.begin() as s:
            done = s.execute(delete(ResponseStateRow).where(ResponseStateRow.id == state_id,
                                                            ResponseStateRow.tenant == tenant))
            return bool(getattr(done, "rowcount", 0))

    def purge_expired(self, now: dt.datetime | None = None) -> list[tuple[str, str]]:
        """Delete every expired state; returns (tenant, id) of each, for the audit log."""
        now = now or utcnow()
        with self.sessions.begin() as s:
            rows = s.execute(select(ResponseStateRow.tenant, ResponseStateRow.id)
                             .where(ResponseStateRow.expires_at <= now)).all()
            if rows:
                s.execute(delete(ResponseStateRow).where(ResponseStateRow.id.in_([r.id for r in rows])))
        return [(r.tenant, r.id) for r in rows]
