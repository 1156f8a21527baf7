"""One vector store inside the worker: its files, their chunks and the index, with search under
the caller's rights and the request's attribute filter (OpenAI's vector store semantics).

Text arrives already opened (decrypted inside the worker); an ``Encoder`` (the worker's embedder)
turns chunk text into normalized vectors. ``to_bytes``/``from_bytes`` are the plaintext a sealed
snapshot holds (sealed_store.py); nothing here touches the disk."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from .chunking import ChunkingStrategy, chunk_text
from .errors import InvalidRetrievalRequest, SealedStoreError
from .filters import Filter, Scalar
from .index import IndexSettings, VectorIndex

MAX_RESULTS = 50  # OpenAI's max_num_results bound


class Encoder(Protocol):
    def token_offsets(self, text: str) -> list[tuple[int, int]]: ...

    def embed_texts(self, texts: list[str]) -> np.ndarray: ...  # [n, dim] float32, normalized


@dataclass(frozen=True)
class StoredFile:
    file_id: str
    filename: str
    attributes: dict[str, Scalar]
    chunk_keys: tuple[int, ...]
    usage_bytes: int
    strategy: ChunkingStrategy


@dataclass(frozen=True)
class StoredChunk:
    file_id: str
    text: str
    start: int
    end: int


@dataclass(frozen=True)
class SearchResult:
    file_id: str
    filename: str
    score: float
    attributes: dict[str, Scalar]
    text: str


class VectorStore:
    def __init__(self, store_id: str, dim: int, settings: IndexSettings | None = None) -> None:
        self.store_id, self.dim = store_id, dim
        self.files: dict[str, StoredFile] = {}
        self.chunks: dict[int, StoredChunk] = {}
        self.index = VectorIndex(dim, settings)
        self._next_key = 0

    def add_file(self, file_id: str, filename: str, text: str, attributes: dict[str, Scalar],
                 strategy: ChunkingStrategy, encoder: Encoder) -> StoredFile:
        """Chunk, embed and index one file; all or nothing (a failure leaves the store as it was)."""
        if file_id in self.files:
            raise InvalidRetrievalRequest(f"file {file_id} is already in vector store {self.store_id}")
        chunks = chunk_text(text, encoder.token_offsets(text), strategy)
        vectors = encoder.embed_texts([c.text for c in chunks]) if chunks else np.zeros((0, self.dim), np.float32)
        keys = list(range(self._next_key, self._next_key + len(chunks)))
        self.index.add(keys, vectors)  # validates shapes first: raises before anything below changes
        self._next_key += len(chunks)
        for key, chunk in zip(keys, chunks, strict=True):
            self.chunks[key] = StoredChunk(file_id, chunk.text, chunk.start, chunk.end)
        stored = StoredFile(file_id, filename, dict(attributes), tuple(keys), len(text.encode()), strategy)
        self.files[file_id] = stored
        return stored

    def remove_file(self, file_id: str) -> bool:
        """Gone from every later search at once; False when the store did not hold it."""
        stored = self.files.pop(file_id, None)
        if stored is None:
            return False
        self.index.remove(stored.chunk_keys)
        for key in stored.chunk_keys:
            self.chunks.pop(key, None)
        return True

    def search(self, query: np.ndarray, k: int, *, readable: Callable[[StoredFile], bool],
               filter: Filter | None = None, min_score: float | None = None) -> list[SearchResult]:
        """The best ``k`` chunks of the files the caller may read (``readable``, the tenant's policy)
        that match ``filter``; a file outside either never contributes a passage."""
        if not 0 < k <= MAX_RESULTS:
            raise InvalidRetrievalRequest(f"max_num_results must be from 1 to {MAX_RESULTS}")
        admitted = [f for f in self.files.values() if readable(f) and (filter is None or filter.matches(f.attributes))]
        # Every file admitted: no key list to build (the index's live rows are exactly these files' chunks).
        allowed = None if len(admitted) == len(self.files) else np.fromiter(
            itertools.chain.from_iterable(f.chunk_keys for f in admitted), np.int64)
        results = []
        for hit in self.index.search(query, k, allowed):
            if min_score is not None and hit.score < min_score:
                continue
            chunk = self.chunks[hit.key]
            stored = self.files[chunk.file_id]
            results.append(SearchResult(stored.file_id, stored.filename, hit.score, stored.attributes, chunk.text))
        return results

    def to_bytes(self) -> bytes:
        meta = {"store_id": self.store_id, "dim": self.dim, "next_key": self._next_key,
                "files": [{"file_id": f.file_id, "filename": f.filename, "attributes": f.attributes,
                           "chunk_keys": list(f.chunk_keys), "usage_bytes": f.usage_bytes,
                           "strategy": [f.strategy.max_chunk_size_tokens, f.strategy.chunk_overlap_tokens]}
                          for f in self.files.values()],
                "chunks": [[k, c.file_id, c.text, c.start, c.end] for k, c in self.chunks.items()]}
        head = json.dumps(meta, ensure_ascii=False).encode()
        return len(head).to_bytes(8, "big") + head + self.index.to_bytes()

    @classmethod
    def from_bytes(cls, data: bytes, store_id: str, settings: IndexSettings | None = None) -> VectorStore:
        try:
            n = int.from_bytes(data[:8], "big")
            meta = json.loads(data[8:8 + n])
            index = VectorIndex.from_bytes(data[8 + n:], settings)
            store = cls(str(meta["store_id"]), int(meta["dim"]), settings)
            store._next_key = int(meta["next_key"])
            for f in meta["files"]:
                store.files[f["file_id"]] = StoredFile(f["file_id"], f["filename"], f["attributes"],
                                                       tuple(f["chunk_keys"]), f["usage_bytes"],
                                                       ChunkingStrategy(*f["strategy"]))
            store.chunks = {int(k): StoredChunk(fid, text, start, end) for k, fid, text, start, end in meta["chunks"]}
        except (ValueError, KeyError, TypeError) as exc:
            raise SealedStoreError(f"the vector store snapshot does not parse: {type(exc).__name__}") from None
        if store.store_id != store_id or index.dim != store.dim:
            raise SealedStoreError("the snapshot is of another vector store")
        store.index = index
        listed = {k for f in store.files.values() for k in f.chunk_keys}
        # The index's live keys are exactly the chunks' (equal counts, each chunk's key held): a search
        # that admits every file passes no key list, so a key no file lists would otherwise be served.
        if set(store.chunks) != listed or len(index) != len(store.chunks) or not all(k in index for k in listed):
            raise SealedStoreError("the snapshot's files, chunks and index disagree")
        return store


def readable_by_all(_: StoredFile) -> bool:
    return True


def only_files(file_ids: Collection[str]) -> Callable[[StoredFile], bool]:
    allowed = frozenset(file_ids)
    return lambda f: f.file_id in allowed
