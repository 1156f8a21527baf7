"""Files and vector stores (api/gateway/files_routes.py, vector_stores_routes.py): ciphertext rows.

A file's content and a store's snapshot (corpus and index) are blobs workers sealed; the gateway
cannot read them. Every read is scoped to the tenant: another tenant's id reads as absent, as an
unknown one does. A store's snapshot is replaced compare-and-set on its version, so two changes
that raced cannot both land (the loser is told to retry), and deleting a store removes its rows."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, bindparam, delete, select, update
from sqlalchemy.orm import Session, sessionmaker

from api.store.models import FileRow, VectorStoreFileRow, VectorStoreRow, utcnow


@dataclass(frozen=True)
class StoredFile:
    id: str
    tenant: str
    purpose: str
    filename: str
    size: int
    model: str
    version: str
    blob: bytes
    created_at: dt.datetime


@dataclass(frozen=True)
class StoredVectorStore:
    id: str
    tenant: str
    name: str | None
    metadata: dict[str, Any]
    model: str
    version: str
    snapshot: bytes
    snapshot_version: int
    usage_bytes: int
    created_at: dt.datetime


@dataclass(frozen=True)
class StoreFile:
    store_id: str
    file_id: str
    batch_id: str | None
    status: str
    error_code: str | None
    error_message: str | None
    usage_bytes: int
    attributes: dict[str, Any]
    chunking: dict[str, Any]
    created_at: dt.datetime


def _file(r: FileRow) -> StoredFile:
    return StoredFile(r.id, r.tenant, r.purpose, r.filename, r.size, r.model, r.version, r.blob, r.created_at)


def _store(r: VectorStoreRow) -> StoredVectorStore:
    return StoredVectorStore(r.id, r.tenant, r.name, dict(r.metadata_), r.model, r.version, r.snapshot,
                             r.snapshot_version, r.usage_bytes, r.created_at)


def _store_file(r: VectorStoreFileRow) -> StoreFile:
    return StoreFile(r.store_id, r.file_id, r.batch_id, r.status, r.error_code, r.error_message, r.usage_bytes,
                     dict(r.attributes), dict(r.chunking), r.created_at)


class RetrievalStore:
    def __init__(self, sessions: sessionmaker[Session]) -> None:
        self.sessions = sessions
        # Every search reads its store's head: built once and run on a bare connection, the read costs
        # a tenth of an ORM `get` (whose statement, session and column matching took ~0.9 ms a search on
        # a loaded 2-core machine; docs/retrieval.md "The cost of the boundary").
        self._engine: Engine = sessions.kw["bind"]
        v = VectorStoreRow
        self._head = select(v.id, v.tenant, v.name, v.metadata_, v.model, v.version, v.snapshot_version,
                            v.usage_bytes, v.created_at).where(v.id == bindparam("store_id"),
                                                                v.tenant == bindparam("tenant"))

    # Files

    def put_file(self, *, file_id: str, tenant: str, purpose: str, filename: str, size: int, model: str,
                 version: str, blob: bytes) -> StoredFile:
        row = FileRow(id=file_id, tenant=tenant, purpose=purpose, filename=filename, size=size, model=model,
                      version=version, blob=blob, created_at=utcnow())
        with self.sessions.begin() as s:
            s.add(row)
        return _file(row)

    def file(self, tenant: str, file_id: str) -> StoredFile | None:
        with self.sessions() as s:
            row = s.get(FileRow, file_id)
            return _file(row) if row is not None and row.tenant == tenant else None

    def files(self, tenant: str, purpose: str | None = None) -> list[StoredFile]:
        with self.sessions() as s:
            query = select(FileRow).where(FileRow.tenant == tenant)
            if purpose is not None:
                query = query.where(FileRow.purpose == purpose)
            return [_file(r) for r in s.scalars(query.order_by(FileRow.created_at, FileRow.id))]

    def delete_file(self, tenant: str, file_id: str) -> bool:
        with self.sessions.begin() as s:
            done = s.execute(delete(FileRow).where(FileRow.id == file_id, FileRow.tenant == tenant))
            return bool(getattr(done, "rowcount", 0))

    # Vector stores

    def put_store(self, *, store_id: str, tenant: str, name: str | None, metadata: dict[str, Any], model: str,
                  version: str) -> StoredVectorStore:
        row = VectorStoreRow(id=store_id, tenant=tenant, name=name, metadata_=metadata, model=model, version=version,
                             snapshot=b"", snapshot_version=0, usage_bytes=0, created_at=utcnow())
        with self.sessions.begin() as s:
            s.add(row)
        return _store(row)

    def store(self, tenant: str, store_id: str) -> StoredVectorStore | None:
        with self.sessions() as s:
            row = s.get(VectorStoreRow, store_id)
            return _store(row) if row is not None and row.tenant == tenant else None

    def store_head(self, tenant: str, store_id: str) -> StoredVectorStore | None:
        """The store without its snapshot's bytes (``snapshot`` is b""): what a search by name needs."""
        with self._engine.connect() as connection:
            row = connection.execute(self._head, {"store_id": store_id, "tenant": tenant}).one_or_none()
        if row is None:
            return None
        ident, owner, name, metadata, model, version, snapshot_version, usage_bytes, created_at = row
        return StoredVectorStore(ident, owner, name, dict(metadata), model, version, b"", snapshot_version,
                                 usage_bytes, created_at)

    def snapshot(self, tenant: str, store_id: str, version: int) -> bytes | None:
        """The store's snapshot if it is still at ``version`` (None: it changed or is gone)."""
        with self.sessions() as s:
            return s.scalar(select(VectorStoreRow.snapshot).where(
                VectorStoreRow.id == store_id, VectorStoreRow.tenant == tenant,
                VectorStoreRow.snapshot_version == version))

    def stores(self, tenant: str) -> list[StoredVectorStore]:
        with self.sessions() as s:
            rows = s.scalars(select(VectorStoreRow).where(VectorStoreRow.tenant == tenant)
                             .order_by(VectorStoreRow.created_at, VectorStoreRow.id))
            return [_store(r) for r in rows]

    def delete_store(self, tenant: str, store_id: str) -> bool:
        with self.sessions.begin() as s:
            s.execute(delete(VectorStoreFileRow).where(VectorStoreFileRow.store_id == store_id,
                                                       VectorStoreFileRow.tenant == tenant))
            done = s.execute(delete(VectorStoreRow).where(VectorStoreRow.id == store_id,
                                                          VectorStoreRow.tenant == tenant))
            return bool(getattr(done, "rowcount", 0))

    def bind_store(self, tenant: str, store_id: str, model: str, version: str) -> None:
        """Bind an unbound store to the model version whose key seals it (a bound one is left as it is)."""
        with self.sessions.begin() as s:
            s.execute(update(VectorStoreRow).where(VectorStoreRow.id == store_id, VectorStoreRow.tenant == tenant,
                                                   VectorStoreRow.model == "")
                      .values(model=model, version=version))

    def replace_snapshot(self, tenant: str, store_id: str, expected_version: int, snapshot: bytes, version: int,
                         usage_delta: int, store_file: StoreFile | None = None, drop_file: str | None = None) -> bool:
        """The store's new snapshot, only if it is still at ``expected_version`` (False otherwise:
        another change landed first), with the file row it adds or the file it drops, in one transaction."""
        with self.sessions.begin() as s:
            done = s.execute(update(VectorStoreRow)
                             .where(VectorStoreRow.id == store_id, VectorStoreRow.tenant == tenant,
                                    VectorStoreRow.snapshot_version == expected_version)
                             .values(snapshot=snapshot, snapshot_version=version,
                                     usage_bytes=VectorStoreRow.usage_bytes + usage_delta))
            if not getattr(done, "rowcount", 0):
                return False
            if drop_file is not None:
                s.execute(delete(VectorStoreFileRow).where(VectorStoreFileRow.store_id == store_id,
                                                           VectorStoreFileRow.file_id == drop_file))
            if store_file is not None:
                s.merge(_row(tenant, store_file))
        return True

    def put_store_file(self, tenant: str, store_file: StoreFile) -> None:
        """A file's row without a change to the snapshot (a file that failed to ingest)."""
        with self.sessions.begin() as s:
            s.merge(_row(tenant, store_file))

    def store_file(self, tenant: str, store_id: str, file_id: str) -> StoreFile | None:
        with self.sessions() as s:
            row = s.get(VectorStoreFileRow, (store_id, file_id))
            return _store_file(row) if row is not None and row.tenant == tenant else None

    def store_files(self, tenant: str, store_id: str, batch_id: str | None = None) -> list[StoreFile]:
        with self.sessions() as s:
            query = select(VectorStoreFileRow).where(VectorStoreFileRow.store_id == store_id,
                                                     VectorStoreFileRow.tenant == tenant)
            if batch_id is not None:
                query = query.where(VectorStoreFileRow.batch_id == batch_id)
            rows = s.scalars(query.order_by(VectorStoreFileRow.created_at, VectorStoreFileRow.file_id))
            return [_store_file(r) for r in rows]

    def drop_failed_file(self, tenant: str, store_id: str, file_id: str) -> bool:
        with self.sessions.begin() as s:
            done = s.execute(delete(VectorStoreFileRow).where(
                VectorStoreFileRow.store_id == store_id, VectorStoreFileRow.file_id == file_id,
                VectorStoreFileRow.tenant == tenant, VectorStoreFileRow.status == "failed"))
            return bool(getattr(done, "rowcount", 0))


def _row(tenant: str, f: StoreFile) -> VectorStoreFileRow:
    return VectorStoreFileRow(store_id=f.store_id, file_id=f.file_id, tenant=tenant, batch_id=f.batch_id,
                              status=f.status, error_code=f.error_code, error_message=f.error_message,
                              usage_bytes=f.usage_bytes, attributes=f.attributes, chunking=f.chunking,
                              created_at=f.created_at)
