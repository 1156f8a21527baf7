"""A tenant's files and vector stores as the worker serves them (docs/retrieval.md).

The worker keeps no store of its own: the gateway holds each file and each vector store as sealed
blobs and passes the latest with every call; the worker opens it, works on it in memory and hands
back a new sealed snapshot. The keys are derived (HKDF-SHA256) from the data key the broker
released to this attested worker, bound to tenant, model and version as response_state.py does,
then per file or store id (sealed_store.py). So the gateway and the operator's disks see only
ciphertext and sizes, and a revoked (wiped) data key makes every file and store unreadable.

Rollback: this worker refuses a store snapshot older than one it has been given or has made (a
replayed snapshot would bring a deleted file back): StaleSnapshot. Opened stores stay in memory
(store_cache.py), keyed by store id, version and the snapshot's SHA-256, so the gateway names a
store's snapshot rather than sending it (``base``), and sends it (``load``) only when this worker
answers SnapshotNeeded. The cache is emptied when the data key is wiped or changes."""

from __future__ import annotations

import hashlib
import json
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, TypeVar

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from enclave_worker.engine.errors import InvalidRequestError
from protocol.rpc.snapshot_segments import SnapshotName

from .chunking import ChunkingStrategy, chunking_strategy
from .errors import InvalidRetrievalRequest, RetrievalError, SealedStoreError, SnapshotNeeded, StaleSnapshot
from .filters import Filter, parse_attributes, parse_filter
from .index import IndexSettings
from .sealed_store import open_snapshot, seal_snapshot, snapshot_version
from .store_cache import StoreCache, StoreCacheSettings
from .vector_store import Encoder, SearchResult, StoredFile, VectorStore

MAX_FILE_BYTES = 8 * 1024 * 1024  # one file's plaintext (OpenAI allows 512 MB; a gRPC message carries 32 MiB)
MAX_QUERY_CHARS = 4096
DEFAULT_RESULTS = 10
_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
T = TypeVar("T")


class StoreEncoder(Encoder, Protocol):
    dim: int

    @property
    def chunk_window(self) -> int: ...


class FileUnreadable(RetrievalError):
    """A file's content the worker cannot index (OpenAI's vector store file `last_error`); its code
    is OpenAI's and its message fixed: never the document's text."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


@dataclass(frozen=True)
class Snapshot:
    blob: bytes
    version: int
    sha256: bytes = b""


@dataclass(frozen=True)
class Ingested:
    snapshot: Snapshot
    file: StoredFile


def retrieval_key(data_key: bytes, tenant: str, model: str, version: str) -> bytes:
    """The root of every file and store key of one (tenant, model, version); wiped data key: refused."""
    if not data_key:
        raise SealedStoreError("the data key is gone (revoked): no file or vector store opens")
    info = b"sealed/retrieval/v1\0" + b"\0".join(s.encode() for s in (tenant, model, version))
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=info).derive(data_key)


def check_id(kind: str, value: str) -> str:
    if not _ID.match(value):
        raise InvalidRetrievalRequest(f"{kind} must be 1 to 64 letters, digits, '-' or '_'")
    return value


class RetrievalService:
    """One tenant's retrieval in one worker. ``data_key`` is read on every call, so a key wiped on
    revocation stops every later call at once."""

    def __init__(self, encoder: StoreEncoder, data_key: Callable[[], bytes], tenant: str, model: str,
                 version: str, settings: IndexSettings | None = None,
                 cache: StoreCacheSettings | None = None) -> None:
        self.encoder, self._data_key, self.settings = encoder, data_key, settings
        self.tenant, self.model, self.version = tenant, model, version
        self._seen: dict[str, int] = {}  # store id -> newest snapshot version given to or made by this worker
        self.cache = StoreCache(cache)
        self._cache_key = b""  # the store key root the cached stores were opened under
        # Held by a call's thread (retrieval_rpcs.off_loop): one call at a time, as on the event loop,
        # so the rollback check and the cache of opened stores never see two calls interleaved.
        self.calls = threading.Lock()

    def _key(self, tenant: str) -> bytes:
        if tenant != self.tenant:
            raise InvalidRetrievalRequest("this worker serves another tenant")
        data_key = self._data_key()
        if not data_key:
            self.evict()
        key = retrieval_key(data_key, self.tenant, self.model, self.version)
        if key != self._cache_key:  # another data key (rotated): nothing opened under the old one is served
            self.evict()
            self._cache_key = key
        return key

    def evict(self) -> None:
        """Forget every opened store (the key was revoked or rotated); what was seen stays refused."""
        self.cache.clear()
        self._cache_key = b""

    # Files

    def seal_file(self, tenant: str, file_id: str, content: bytes) -> bytes:
        key = self._key(tenant)
        if len(content) > MAX_FILE_BYTES:
            raise InvalidRetrievalRequest(f"a file may have at most {MAX_FILE_BYTES} bytes")
        return seal_snapshot(key, "file/" + check_id("file_id", file_id), 0, content)

    def _file_text(self, key: bytes, file_id: str, blob: bytes) -> str:
        _, content = open_snapshot(key, "file/" + file_id, blob)
        try:
            return content.decode("utf-8")
        except UnicodeDecodeError:
            raise FileUnreadable("unsupported_file", "only UTF-8 text files can be indexed") from None

    # Stores

    def _open(self, key: bytes, store_id: str, blob: bytes,
              base: SnapshotName | None = None) -> tuple[int, VectorStore]:
        """The store at ``base`` from the cache (SnapshotNeeded when it is not there), or opened from
        ``blob`` when the gateway sends it inline (the first protocol; the cache still spares the open)."""
        check_id("vector_store_id", store_id)
        seen = self._seen.get(store_id, 0)
        if base is not None:
            if base.store_id != store_id:
                raise InvalidRetrievalRequest("the snapshot named is another vector store's")
            self._not_stale(base.version, seen)
            if base.version == 0 and not base.sha256:
                return 0, VectorStore(store_id, self.encoder.dim, self.settings)  # no file yet
            cached = self.cache.get(base)
            if cached is None:
                raise SnapshotNeeded(f"this worker does not hold vector store {store_id} at version {base.version}")
            return base.version, cached
        if not blob:
            if seen:
                raise StaleSnapshot(f"vector store {store_id} has a snapshot; an empty one is refused")
            return 0, VectorStore(store_id, self.encoder.dim, self.settings)
        name = SnapshotName(store_id, snapshot_version(blob), hashlib.sha256(blob).digest())
        self._not_stale(name.version, seen)
        cached = self.cache.get(name)
        if cached is not None:
            return name.version, cached
        return name.version, self._load(key, name, blob)

    @staticmethod
    def _not_stale(version: int, seen: int) -> None:
        if version < seen:
            raise StaleSnapshot(f"the snapshot is version {version}; this worker has seen version {seen}")

    def _load(self, key: bytes, name: SnapshotName, blob: bytes) -> VectorStore:
        if hashlib.sha256(blob).digest() != name.sha256:
            raise SealedStoreError("the snapshot's SHA-256 is not the one named")
        seen = self._seen.get(name.store_id, 0)
        self._not_stale(name.version, seen)
        version, plain = open_snapshot(key, "store/" + name.store_id, blob, min_version=seen)
        if version != name.version:
            raise SealedStoreError(f"the snapshot is version {version}, not the {name.version} named")
        store = VectorStore.from_bytes(plain, name.store_id, self.settings)
        self._seen[name.store_id] = max(seen, version)
        self.cache.put(name, store, len(blob))
        return store

    def load(self, tenant: str, name: SnapshotName, blob: bytes) -> None:
        """A snapshot the gateway sent (WriteStoreSnapshot) after SnapshotNeeded: opened and held."""
        key = self._key(tenant)
        check_id("vector_store_id", name.store_id)
        if self.cache.get(name) is None:
            self._load(key, name, blob)

    def hold(self, tenant: str, name: SnapshotName) -> None:
        """A sealed search's snapshot, checked before its envelope opens (the envelope opens once: a
        replay is refused), so that SnapshotNeeded can still send the gateway for it; pinned until
        ``cache.unpin``. The search itself checks the name again (a change may have replaced it)."""
        self._key(tenant)
        check_id("vector_store_id", name.store_id)
        if (name.version or name.sha256) and self.cache.get(name) is None:
            raise SnapshotNeeded(f"this worker does not hold vector store {name.store_id} at version {name.version}")
        self.cache.pin(name.store_id)

    def made(self, tenant: str, name: SnapshotName) -> bytes:
        """A snapshot this worker made that the gateway has not read yet (ReadStoreSnapshot). From the
        moment it is asked for, its version counts as seen: the gateway may hold it from then on, so
        the one before it would be a replay. Until then it does not (a change the gateway never got,
        its read or its database write having failed, leaves the store usable at the version before)."""
        self._key(tenant)  # a revoked key: nothing leaves, not even ciphertext
        blob = self.cache.unread(name)
        if not blob:
            raise SnapshotNeeded(f"this worker holds no new snapshot of vector store {name.store_id[:64]} "
                                 f"at version {name.version}")
        self._seen[name.store_id] = max(self._seen.get(name.store_id, 0), name.version)
        return blob

    def read(self, name: SnapshotName) -> None:
        self.cache.read(name)

    def _reseal(self, key: bytes, store_id: str, version: int, store: VectorStore, keep: bool) -> Snapshot:
        """The store's next snapshot; ``keep``: held until the gateway reads it (the caller named its base;
        seen once read: ``made``), else returned now, so seen now."""
        blob = seal_snapshot(key, "store/" + store_id, version + 1, store.to_bytes())
        name = SnapshotName(store_id, version + 1, hashlib.sha256(blob).digest())
        if not keep:
            self._seen[store_id] = max(self._seen.get(store_id, 0), version + 1)
        self.cache.put(name, store, len(blob), unread=blob if keep else b"")
        return Snapshot(blob, version + 1, name.sha256)

    def _changed(self, key: bytes, store_id: str, version: int, store: VectorStore, keep: bool,
                 change: Callable[[], T]) -> tuple[T, Snapshot]:
        """``change`` to the open store, then its next snapshot; if either fails the store's entry is
        dropped (it may no longer be the snapshot it was cached as)."""
        try:
            done = change()
            return done, self._reseal(key, store_id, version, store, keep)
        except BaseException:
            self.cache.drop(store_id)
            raise

    def ingest(self, tenant: str, store_id: str, snapshot: bytes, file_id: str, filename: str, file_blob: bytes,
               attributes: object, chunking: object, base: SnapshotName | None = None) -> Ingested:
        """Chunk, embed and index one sealed file into the store; the store's new sealed snapshot.
        A bad request (attributes, strategy) raises InvalidRetrievalRequest, a file that cannot be
        indexed FileUnreadable; either way the store is as it was. With ``base`` (the snapshot by
        name) the new snapshot is held until the gateway reads it (``made``)."""
        key = self._key(tenant)
        check_id("file_id", file_id)
        attrs = parse_attributes(attributes)
        if chunking is not None and not isinstance(chunking, dict):
            raise InvalidRetrievalRequest("chunking_strategy must be an object")
        strategy = chunking_strategy(chunking, self.encoder.chunk_window)
        version, store = self._open(key, store_id, snapshot, base)
        text = self._file_text(key, file_id, file_blob)

        def add() -> StoredFile:
            try:
                return store.add_file(file_id, filename[:256], text, attrs, strategy, self.encoder)
            except InvalidRequestError:  # the encoder refused a chunk (e.g. characters it cannot read)
                raise FileUnreadable("invalid_file", "the file's text could not be embedded") from None

        stored, snapshot_made = self._changed(key, store_id, version, store, base is not None, add)
        return Ingested(snapshot_made, stored)

    def delete_file(self, tenant: str, store_id: str, snapshot: bytes, file_id: str,
                    base: SnapshotName | None = None) -> Snapshot:
        """The store without the file: gone from the index and the sealed snapshot at once."""
        key = self._key(tenant)
        version, store = self._open(key, store_id, snapshot, base)
        if file_id not in store.files:
            raise InvalidRetrievalRequest(f"vector store {store_id} has no file {file_id[:64]}")
        return self._changed(key, store_id, version, store, base is not None, lambda: store.remove_file(file_id))[1]

    def search(self, tenant: str, store_id: str, snapshot: bytes, query: str, max_num_results: int = 0,
               filters: object = None, score_threshold: float | None = None, rewrite_query: bool = False,
               readable: Callable[[StoredFile], bool] | None = None,
               base: SnapshotName | None = None) -> list[SearchResult]:
        """The passages of the files ``readable`` admits (the tenant's policy; all when None) that
        match ``filters``, best first, at least ``score_threshold`` (cosine)."""
        key = self._key(tenant)
        if rewrite_query:
            raise InvalidRetrievalRequest("rewrite_query is not supported: the query is searched as given")
        if not isinstance(query, str) or not query.strip() or len(query) > MAX_QUERY_CHARS:
            raise InvalidRetrievalRequest(f"query must be a non-empty string of at most {MAX_QUERY_CHARS} characters")
        if score_threshold is not None and not 0.0 <= score_threshold <= 1.0:
            raise InvalidRetrievalRequest("ranking_options.score_threshold must be from 0 to 1")
        parsed: Filter | None = None if filters is None else parse_filter(filters)
        _, store = self._open(key, store_id, snapshot, base)
        try:
            vector = self.encoder.embed_texts([query])[0]
        except InvalidRequestError as exc:
            raise InvalidRetrievalRequest(f"query: {exc}") from None
        return store.search(vector, max_num_results or DEFAULT_RESULTS, readable=readable or (lambda _: True),
                            filter=parsed, min_score=score_threshold)


def results_json(results: list[SearchResult]) -> str:
    """OpenAI's vector store search results (the `data` of a search page)."""
    return json.dumps([{"file_id": r.file_id, "filename": r.filename, "score": round(float(r.score), 6),
                        "attributes": r.attributes, "content": [{"type": "text", "text": r.text}]}
                       for r in results], ensure_ascii=False)


def strategy_json(strategy: ChunkingStrategy) -> str:
    return json.dumps(strategy.as_openai())
