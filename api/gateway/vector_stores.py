"""The gateway's side of files and vector stores (docs/retrieval.md): ciphertext rows and worker calls.

A file is sealed by a worker as it arrives (SealFile) and kept as ciphertext; a vector store is one
sealed snapshot that a worker of the store's model version opens, changes and seals again on every
ingestion or deletion (IngestFile, DeleteStoreFile) and searches (SearchStore). Workers keep the
stores they opened, so the calls name the snapshot and carry it only to a worker that lacks it
(store_snapshots.py). The gateway routes,
keeps rows, serializes a store's changes (a lock per store, then compare-and-set on its snapshot
version) and audits; it never holds a key, a document's text or a vector.

Which model's key: a file is sealed by a worker of the first model (by name) the caller's key may use
whose workers hold an embedding model (the others answer 501), and bound to its model and version; a
store is bound to the model and version of its first file (until then it holds nothing), and only
files sealed under the same key join it."""

from __future__ import annotations

import asyncio
import json
import secrets
import weakref
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from api.gateway.errors import GatewayError
from api.gateway.retrieval_audit import file_id_fields
from api.gateway.service import GatewayService
from api.gateway.store_snapshots import SnapshotCalls, StoreChanged
from api.store.models import utcnow
from api.store.repo import KeyRecord
from api.store.retrieval import RetrievalStore, StoredFile, StoredVectorStore, StoreFile
from protocol.rpc import worker_pb2
from protocol.rpc.snapshot_segments import SnapshotName

MAX_FILE_BYTES = 8 * 1024 * 1024  # the worker's bound too (enclave_worker/retrieval/service.py)
MAX_FILES_PER_CALL = 500  # OpenAI's bound on a batch's file_ids
CAS_TRIES = 3


def not_found(kind: str, ident: str, param: str | None = None) -> GatewayError:
    """The same answer for an unknown id and another tenant's."""
    return GatewayError(404, f"No {kind} found with id '{ident[:64]}'.", param=param, code="not_found")


def new_id(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(12)}"


@dataclass
class GatewayRetrieval:
    service: GatewayService
    rows: RetrievalStore = field(init=False)
    snapshots: SnapshotCalls = field(init=False)
    # One lock per store while someone holds it (weak: an idle store's lock is dropped).
    _locks: weakref.WeakValueDictionary[str, asyncio.Lock] = field(default_factory=weakref.WeakValueDictionary)

    def __post_init__(self) -> None:
        self.rows = RetrievalStore(self.service.store.sessions)
        self.snapshots = SnapshotCalls(self.service, self.rows)

    def _audit(self, key: KeyRecord, action: str, **metadata: Any) -> None:
        self.service.audit.append(tenant=key.tenant, action=action, decision="allow", reason="caller",
                                  metadata={"key_id": key.key_id, **metadata})

    def models_for(self, key: KeyRecord) -> list[str]:
        models = self.service.catalog.models_for(key)
        if not models:
            raise GatewayError(503, "no model of this tenant is served now: files and vector stores are sealed "
                                    "by its workers", type_="server_error", code="model_unavailable")
        return models

    # Files

    async def create_file(self, key: KeyRecord, filename: str, purpose: str, content: bytes) -> StoredFile:
        self.service.check_plaintext_allowed(key)  # the content crossed to the gateway in clear
        if purpose not in ("assistants", "user_data"):
            raise GatewayError(400, "purpose must be 'assistants' or 'user_data'", param="purpose",
                               code="invalid_value")
        if len(content) > MAX_FILE_BYTES:
            raise GatewayError(413, f"a file may have at most {MAX_FILE_BYTES} bytes", param="file",
                               code="file_too_large")
        file_id = new_id("file")
        request = worker_pb2.SealFileRequest(tenant=key.tenant, key_id=key.key_id, file_id=file_id, content=content)
        for model in self.models_for(key):
            try:
                reply: worker_pb2.SealedBlob = await self.service.call(
                    key, model, self.service.catalog.resolve(key, model), "SealFile", request)
            except GatewayError as exc:
                if exc.status != 501:  # 501: a model without an encoder; the next one may have one
                    raise
                continue
            break
        else:
            raise GatewayError(503, "no embedding model of this tenant is served now: files are sealed and "
                                    "indexed by its workers", type_="server_error", code="model_unavailable")
        stored = self.rows.put_file(file_id=file_id, tenant=key.tenant, purpose=purpose, filename=filename[:256],
                                    size=len(content), model=model, version=reply.key_version, blob=reply.blob)
        self._audit(key, "file.create", file_id=file_id, bytes=len(content))
        return stored

    def file(self, key: KeyRecord, file_id: str) -> StoredFile:
        found = self.rows.file(key.tenant, file_id)
        if found is None:
            raise not_found("file", file_id)
        return found

    def delete_file(self, key: KeyRecord, file_id: str) -> None:
        """The file's sealed content; the vector stores it was added to keep their chunks until it is
        removed from them (OpenAI's semantics)."""
        if not self.rows.delete_file(key.tenant, file_id):
            raise not_found("file", file_id)
        self._audit(key, "file.delete", file_id=file_id)

    # Vector stores

    def create_store(self, key: KeyRecord, name: str | None, metadata: dict[str, Any]) -> StoredVectorStore:
        """An empty store, bound to no key until its first file."""
        store = self.rows.put_store(store_id=new_id("vs"), tenant=key.tenant, name=name, metadata=metadata,
                                    model="", version="")
        self._audit(key, "vector_store.create", vector_store_id=store.id)
        return store

    def store(self, key: KeyRecord, store_id: str) -> StoredVectorStore:
        """The store's row without its snapshot's bytes (a worker that lacks them gets them from the
        database when it says so: store_snapshots.py)."""
        found = self.rows.store_head(key.tenant, store_id)
        if found is None:
            raise not_found("vector store", store_id)
        return found

    def delete_store(self, key: KeyRecord, store_id: str) -> None:
        if not self.rows.delete_store(key.tenant, store_id):
            raise not_found("vector store", store_id)
        self._audit(key, "vector_store.delete", vector_store_id=store_id)

    def _lock(self, store_id: str) -> asyncio.Lock:
        lock = self._locks.get(store_id)
        if lock is None:
            lock = self._locks[store_id] = asyncio.Lock()
        return lock

    async def _pinned(self, key: KeyRecord, store: StoredVectorStore, method: str, request: Any) -> Any:
        """A call to a worker of the store's model version: only its key opens the store."""
        return await self.service.call(key, store.model, {store.version: 100.0}, method, request)

    async def attach(self, key: KeyRecord, store_id: str, file_id: str, attributes: Any, chunking: Any,
                     batch_id: str | None = None) -> StoreFile:
        """Chunk, embed and index a file into the store, in a worker; `completed`, or `failed` with
        OpenAI's last_error when the worker cannot index the file. A file already in it is returned."""
        store = self.store(key, store_id)
        file = self.rows.file(key.tenant, file_id)
        if file is None:
            raise not_found("file", file_id, param="file_id")
        if not store.model:  # its first file: the store is bound to that file's model version for good
            self.rows.bind_store(key.tenant, store_id, file.model, file.version)
            store = self.store(key, store_id)
        if (file.model, file.version) != (store.model, store.version):
            raise GatewayError(400, "the file was sealed under another model version than the vector store's",
                               param="file_id", code="invalid_value")
        async with self._lock(store_id):
            existing = self.rows.store_file(key.tenant, store_id, file_id)
            if existing is not None and existing.status == "completed":
                return existing
            for _ in range(CAS_TRIES):
                store = self.store(key, store_id)
                request = worker_pb2.IngestFileRequest(
                    tenant=key.tenant, key_id=key.key_id, store_id=store_id, file_id=file_id, filename=file.filename,
                    file_blob=file.blob, attributes_json=json.dumps(attributes if attributes is not None else {}),
                    chunking_json=json.dumps(chunking) if chunking is not None else "")
                try:
                    reply, worker = await self.snapshots.call(key, store, "IngestFile",
                                                              partial(_with_base, request))
                except StoreChanged:
                    continue
                row = StoreFile(store_id, file_id, batch_id, "completed" if not reply.error_code else "failed",
                                reply.error_code or None, reply.error_message or None, reply.usage_bytes,
                                attributes or {}, json.loads(reply.chunking_json) if reply.chunking_json else {},
                                utcnow())
                if reply.error_code:
                    self.rows.put_store_file(key.tenant, row)
                    self._audit(key, "vector_store.file.failed", vector_store_id=store_id, file_id=file_id)
                    return row
                blob = await self.snapshots.read_made(worker, key.tenant, reply.made)
                if self.rows.replace_snapshot(key.tenant, store_id, store.snapshot_version, blob,
                                              reply.made.version, reply.usage_bytes, store_file=row):
                    self.snapshots.remember(SnapshotName.of(reply.made))
                    self._audit(key, "vector_store.file.add", vector_store_id=store_id, file_id=file_id)
                    return row
        raise GatewayError(409, "the vector store changed meanwhile; retry", code="conflict")

    def store_file(self, key: KeyRecord, store_id: str, file_id: str) -> StoreFile:
        self.store(key, store_id)
        found = self.rows.store_file(key.tenant, store_id, file_id)
        if found is None:
            raise not_found("file", file_id)
        return found

    async def detach(self, key: KeyRecord, store_id: str, file_id: str) -> None:
        """The file out of the store's index and sealed snapshot, in one step."""
        async with self._lock(store_id):
            found = self.store_file(key, store_id, file_id)
            if found.status != "completed":
                self.rows.drop_failed_file(key.tenant, store_id, file_id)
                return
            for _ in range(CAS_TRIES):
                store = self.store(key, store_id)
                request = worker_pb2.DeleteStoreFileRequest(tenant=key.tenant, key_id=key.key_id, store_id=store_id,
                                                            file_id=file_id)
                try:
                    reply, worker = await self.snapshots.call(key, store, "DeleteStoreFile",
                                                              partial(_with_base, request))
                except StoreChanged:
                    continue
                blob = await self.snapshots.read_made(worker, key.tenant, reply.made)
                if self.rows.replace_snapshot(key.tenant, store_id, store.snapshot_version, blob, reply.made.version,
                                              -found.usage_bytes, drop_file=file_id):
                    self.snapshots.remember(SnapshotName.of(reply.made))
                    self._audit(key, "vector_store.file.delete", vector_store_id=store_id, file_id=file_id)
                    return
        raise GatewayError(409, "the vector store changed meanwhile; retry", code="conflict")

    async def search(self, key: KeyRecord, store_id: str, query: str, max_num_results: int, filters: Any,
                     score_threshold: float | None, rewrite_query: bool) -> list[dict[str, Any]]:
        """The worker's passages; audited with the ids of the files they came from."""
        self.service.check_plaintext_allowed(key)  # the passages come back in clear
        store = self.store(key, store_id)
        if not store.model:  # no file yet: nothing to search, nothing to open
            self._audit(key, "vector_store.search", vector_store_id=store_id, search_id=new_id("search"), files=0)
            return []
        request = worker_pb2.SearchStoreRequest(
            tenant=key.tenant, key_id=key.key_id, store_id=store_id, query=query,
            max_num_results=max_num_results, filters_json=json.dumps(filters) if filters is not None else "",
            has_score_threshold=score_threshold is not None, score_threshold=score_threshold or 0.0,
            rewrite_query=rewrite_query, caller=key.key_id)
        reply: worker_pb2.SearchStoreReply | None = None
        for _ in range(CAS_TRIES):  # a change that lands between reading the row and the worker's load: again
            try:
                reply, _worker = await self.snapshots.call(key, store, "SearchStore",
                                                           partial(_with_base, request))
                break
            except StoreChanged:
                store = self.store(key, store_id)
        if reply is None:
            raise StoreChanged()
        # One signed entry naming every file that gave passages (retrieval_audit.py: why one, and how packed).
        self._audit(key, "vector_store.search", vector_store_id=store_id, search_id=new_id("search"),
                    files=len(reply.file_ids), **file_id_fields(reply.file_ids))
        results: list[dict[str, Any]] = json.loads(reply.results_json)
        return results


def _with_base(request: Any, base: worker_pb2.StoreSnapshotRef) -> Any:
    """``request`` naming the snapshot ``base`` (its ``snapshot`` bytes left empty)."""
    request.base.CopyFrom(base)
    return request
