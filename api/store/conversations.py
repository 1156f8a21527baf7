"""Conversations (OpenAI's Conversations API): rows of worker-sealed ciphertext, per tenant.

A conversation row holds what routing needs in clear (owner, the model and version whose key
sealed its items, bound at the first one, the expiry) and its sealed metadata; each item is a
blob of its own, in order (`seq`). A conversation made in sealed mode is one blob instead
(`sealed_state`: its items and metadata, sealed by a worker as a whole), replaced as a whole only
in place of the one the change was made from. Every read is scoped to the tenant: another tenant's id reads
as absent, as an unknown, deleted or expired one does.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session, sessionmaker

from api.store.models import ConversationItemRow, ConversationRow, utcnow


@dataclass(frozen=True)
class StoredConversation:
    id: str
    tenant: str
    model: str | None
    version: str | None
    metadata_blob: bytes | None
    created_at: dt.datetime
    sealed_state: bytes | None = None  # made in sealed mode: the whole conversation, worker-sealed


@dataclass(frozen=True)
class StoredItem:
    id: str
    seq: int
    blob: bytes


def _conversation(row: ConversationRow) -> StoredConversation:
    created = row.created_at if row.created_at.tzinfo else row.created_at.replace(tzinfo=dt.UTC)
    return StoredConversation(row.id, row.tenant, row.model, row.version, row.metadata_blob, created,
                              row.sealed_state)


class Conversations:
    def __init__(self, sessions: sessionmaker[Session]) -> None:
        self.sessions = sessions

    def create(self, conversation_id: str, tenant: str, retention: dt.timedelta) -> StoredConversation:
        now = utcnow()
        row = ConversationRow(id=conversation_id, tenant=tenant, created_at=now, expires_at=now + retention)
        with self.sessions.begin() as s:
            s.add(row)
        return _conversation(row)

    def create_sealed(self, conversation_id: str, tenant: str, model: str, version: str, blob: bytes,
                      retention: dt.timedelta) -> StoredConversation:
        """A conversation made in sealed mode, bound at once to the version whose worker sealed it."""
        now = utcnow()
        row = ConversationRow(id=conversation_id, tenant=tenant, model=model, version=version, sealed_state=blob,
                              created_at=now, expires_at=now + retention)
        with self.sessions.begin() as s:
            s.add(row)
        return _conversation(row)

    def replace_sealed(self, tenant: str, conversation_id: str, opened: bytes, blob: bytes) -> bool:
        """Keep `blob` in place of `opened`, the state the change was made from; False if the conversation
        is gone or changed meanwhile (a concurrent call: its change is not lost under this one)."""
        with self.sessions.begin() as s:
            row = s.get(ConversationRow, conversation_id, with_for_update=True)
            if row is None or row.tenant != tenant or row.sealed_state != opened:
                return False
            row.sealed_state = blob
            return True

    def get(self, tenant: str, conversation_id: str, now: dt.datetime | None = None) -> StoredConversation | None:
        with self.sessions() as s:
            row = s.get(ConversationRow, conversation_id)
            if row is None or row.tenant != tenant:
                return None
            expires = row.expires_at if row.expires_at.tzinfo else row.expires_at.replace(tzinfo=dt.UTC)
            return _conversation(row) if expires > (now or utcnow()) else None

    def bind(self, tenant: str, conversation_id: str, model: str, version: str) -> bool:
        """Bind an unbound conversation to the model version whose key seals its items; False when
        it is bound to another one (or gone)."""
        with self.sessions.begin() as s:
            row = s.get(ConversationRow, conversation_id, with_for_update=True)
            if row is None or row.tenant != tenant:
                return False
            if row.model is None:
                row.model, row.version = model, version
            return (row.model, row.version) == (model, version)

    def set_metadata(self, tenant: str, conversation_id: str, blob: bytes | None) -> bool:
        with self.sessions.begin() as s:
            row = s.get(ConversationRow, conversation_id)
            if row is None or row.tenant != tenant:
                return False
            row.metadata_blob = blob
            return True

    def add_items(self, tenant: str, conversation_id: str, items: list[tuple[str, bytes]]) -> bool:
        with self.sessions.begin() as s:
            row = s.get(ConversationRow, conversation_id, with_for_update=True)
            if row is None or row.tenant != tenant:
                return False
            last = s.scalar(select(func.max(ConversationItemRow.seq))
                            .where(ConversationItemRow.conversation_id == conversation_id))
            start = (last or 0) + 1
            s.add_all(ConversationItemRow(conversation_id=conversation_id, id=item_id, seq=start + i, blob=blob)
                      for i, (item_id, blob) in enumerate(items))
            return True

    def items(self, tenant: str, conversation_id: str) -> list[StoredItem]:
        """Every item, oldest first (the caller has checked the conversation is the tenant's)."""
        with self.sessions() as s:
            owner = s.scalar(select(ConversationRow.tenant).where(ConversationRow.id == conversation_id))
            if owner != tenant:
                return []
            rows = s.scalars(select(ConversationItemRow).where(ConversationItemRow.conversation_id == conversation_id)
                             .order_by(ConversationItemRow.seq)).all()
            return [StoredItem(r.id, r.seq, r.blob) for r in rows]

    def delete_item(self, tenant: str, conversation_id: str, item_id: str) -> bool:
        with self.sessions.begin() as s:
            owner = s.scalar(select(ConversationRow.tenant).where(ConversationRow.id == conversation_id))
            if owner != tenant:
                return False
            done = s.execute(delete(ConversationItemRow).where(ConversationItemRow.conversation_id == conversation_id,
                                                               ConversationItemRow.id == item_id))
            return bool(getattr(done, "rowcount", 0))

    def delete(self, tenant: str, conversation_id: str) -> bool:
        with self.sessions.begin() as s:
            owner = s.scalar(select(ConversationRow.tenant).where(ConversationRow.id == conversation_id))
            if owner != tenant:
                return False
            # Items first: SQLite enforces no foreign keys unless asked, so the cascade is not relied on.
            s.execute(delete(ConversationItemRow).where(ConversationItemRow.conversation_id == conversation_id))
            s.execute(delete(ConversationRow).where(ConversationRow.id == conversation_id))
            return True

    def purge_expired(self, now: dt.datetime | None = None) -> list[tuple[str, str]]:
        """Delete every expired conversation with its items; returns (tenant, id) of each."""
        now = now or utcnow()
        with self.sessions.begin() as s:
            rows = s.execute(select(ConversationRow.tenant, ConversationRow.id)
                             .where(ConversationRow.expires_at <= now)).all()
            ids = [r.id for r in rows]
            if ids:
                s.execute(delete(ConversationItemRow).where(ConversationItemRow.conversation_id.in_(ids)))
                s.execute(delete(ConversationRow).where(ConversationRow.id.in_(ids)))
        return [(r.tenant, r.id) for r in rows]
