"""The vector index of a vector store: faiss's HNSW graph over inner products of normalized
embeddings (cosine), held in the worker's memory (docs/retrieval.md says why faiss).

Each chunk has an integer key. Search takes the set of keys the caller may read and never returns
another: the set becomes a bitmap faiss checks inside the graph walk, and a set small enough to
scan is searched exactly instead (a graph walk restricted to a few rows can miss some). Removed
keys are dropped from every search at once and purged from the graph when enough have gone."""

from __future__ import annotations

import io
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass

import faiss
import numpy as np

from .errors import InvalidRetrievalRequest, SealedStoreError


@dataclass(frozen=True)
class IndexSettings:
    connectivity: int = 32  # HNSW's M: graph degree
    ef_construction: int = 128
    ef_search: int = 128  # recall@10 >= 0.95 against exact search on a 10k-chunk corpus (benchmark)
    exact_below: int = 4096  # allowed rows at or below this many: exact scan, not the graph
    compact_fraction: float = 0.25  # rebuild the graph when this share of its rows is removed


@dataclass(frozen=True)
class Hit:
    key: int
    score: float  # inner product of normalized vectors: cosine similarity


class VectorIndex:
    def __init__(self, dim: int, settings: IndexSettings | None = None) -> None:
        if dim <= 0:
            raise InvalidRetrievalRequest("the index dimension must be positive")
        self.dim, self.settings = dim, settings or IndexSettings()
        self._rows = np.zeros((0, dim), dtype=np.float32)
        self._keys = np.zeros(0, dtype=np.int64)
        self._live = np.zeros(0, dtype=bool)
        self._row_of: dict[int, int] = {}
        # The keys sorted and their rows, made at the first search after a change: a search maps the
        # keys it may read to rows in numpy (searchsorted), not key by key in Python (2 ms at 10k).
        self._by_key: tuple[np.ndarray, np.ndarray] | None = None
        self._graph = self._new_graph()

    def _new_graph(self) -> faiss.IndexHNSWFlat:
        graph = faiss.IndexHNSWFlat(self.dim, self.settings.connectivity, faiss.METRIC_INNER_PRODUCT)
        graph.hnsw.efConstruction = self.settings.ef_construction
        return graph

    def __len__(self) -> int:
        return len(self._row_of)

    def __contains__(self, key: int) -> bool:
        return key in self._row_of

    def add(self, keys: Iterable[int], vectors: np.ndarray) -> None:
        """Add chunks; a key already present, a shape mismatch or a non-finite vector is refused whole."""
        key_arr = np.fromiter((int(k) for k in keys), dtype=np.int64)
        vecs = np.ascontiguousarray(vectors, dtype=np.float32)
        if vecs.ndim != 2 or vecs.shape != (len(key_arr), self.dim):
            raise InvalidRetrievalRequest(f"expected {len(key_arr)} vectors of {self.dim} values, got {vecs.shape}")
        if not np.isfinite(vecs).all():
            raise InvalidRetrievalRequest("vectors must be finite")
        if len(set(key_arr.tolist())) != len(key_arr) or any(int(k) in self._row_of for k in key_arr):
            raise InvalidRetrievalRequest("chunk keys must be new and distinct")
        first = len(self._keys)
        self._rows = np.concatenate([self._rows, vecs])
        self._keys = np.concatenate([self._keys, key_arr])
        self._live = np.concatenate([self._live, np.ones(len(key_arr), dtype=bool)])
        self._row_of.update((int(k), first + i) for i, k in enumerate(key_arr))
        self._by_key = None
        self._graph.add(vecs)

    def remove(self, keys: Iterable[int]) -> int:
        """Drop chunks from every later search; returns how many were present."""
        removed = 0
        for key in keys:
            row = self._row_of.pop(int(key), None)
            if row is not None:
                self._live[row] = False
                removed += 1
        dead = len(self._keys) - len(self._row_of)
        if dead and dead >= self.settings.compact_fraction * len(self._keys):
            self._compact()
        return removed

    def _compact(self) -> None:
        live = self._live
        self._rows, self._keys = np.ascontiguousarray(self._rows[live]), self._keys[live]
        self._live = np.ones(len(self._keys), dtype=bool)
        self._row_of = {int(k): i for i, k in enumerate(self._keys)}
        self._by_key = None
        self._graph = self._new_graph()
        if len(self._rows):
            self._graph.add(self._rows)

    def _rows_of(self, keys: np.ndarray) -> np.ndarray:
        """The rows of those ``keys`` the index holds (a key never added or compacted away: none)."""
        if self._by_key is None:
            order = np.argsort(self._keys, kind="stable")
            self._by_key = self._keys[order], order
        ordered, rows = self._by_key
        at = np.searchsorted(ordered, keys)
        held = at < len(ordered)
        held[held] = ordered[at[held]] == keys[held]
        return rows[at[held]]

    def search(self, query: np.ndarray, k: int, allowed: Iterable[int] | np.ndarray | None = None) -> list[Hit]:
        """The ``k`` nearest live chunks among ``allowed`` keys (None: every key), best first."""
        q = np.ascontiguousarray(query, dtype=np.float32).reshape(1, -1)
        if q.shape[1] != self.dim or not np.isfinite(q).all():
            raise InvalidRetrievalRequest(f"the query must be {self.dim} finite values")
        if k <= 0:
            raise InvalidRetrievalRequest("k must be positive")
        mask = self._live.copy()
        if allowed is not None:
            keys = allowed if isinstance(allowed, np.ndarray) else np.fromiter((int(k) for k in allowed), np.int64)
            permitted = np.zeros_like(mask)
            permitted[self._rows_of(keys.astype(np.int64, copy=False))] = True
            mask &= permitted
        count = int(mask.sum())
        if count == 0:
            return []
        if count <= self.settings.exact_below:
            rows = np.flatnonzero(mask)
            scores = self._rows[rows] @ q[0]
            top = np.argsort(-scores, kind="stable")[:k]
            return [Hit(int(self._keys[rows[i]]), float(scores[i])) for i in top]
        # faiss keeps raw pointers to the bitmap and the selector: both must outlive the search.
        bitmap = np.packbits(mask, bitorder="little")
        selector = faiss.IDSelectorBitmap(len(mask), faiss.swig_ptr(bitmap))
        params = faiss.SearchParametersHNSW(  # type: ignore[attr-defined]  # (faiss's stubs lack it)
            sel=selector, efSearch=max(self.settings.ef_search, k))
        scores, found = self._graph.search(q, k, params=params)
        return [Hit(int(self._keys[r]), float(s)) for r, s in zip(found[0], scores[0], strict=True) if r >= 0]

    def to_bytes(self) -> bytes:
        """The whole index (keys, removals, graph) as bytes, for sealing (store.py); in memory. The rows
        are not written beside the graph: its flat storage holds the same vectors, in the same order
        (every row is added to both, and a compaction rebuilds the graph from the rows), so writing
        them twice made every snapshot 40% larger, and every ingest seals, hashes, sends and stores
        the whole snapshot (issue #51: 1,536 of a chunk's 3,772 sealed bytes)."""
        out = io.BytesIO()
        np.savez(out, keys=self._keys, live=self._live,
                 graph=faiss.serialize_index(self._graph), dim=np.array([self.dim]))
        return out.getvalue()

    @classmethod
    def from_bytes(cls, data: bytes, settings: IndexSettings | None = None) -> VectorIndex:
        try:
            with np.load(io.BytesIO(data), allow_pickle=False) as parts:
                index = cls(int(parts["dim"][0]), settings)
                index._keys, index._live = parts["keys"], parts["live"]
                graph = faiss.deserialize_index(parts["graph"])  # (already its concrete class)
                if not isinstance(graph, faiss.IndexHNSWFlat):
                    raise SealedStoreError("the index's graph is not an HNSW graph")
                # A snapshot written before the rows were left out still carries them; else they are
                # the graph's own (flat) vectors.
                index._rows = parts["rows"] if "rows" in parts else graph.storage.reconstruct_n(0, graph.ntotal)
        except (ValueError, KeyError, OSError, RuntimeError, EOFError, zipfile.BadZipFile) as exc:
            raise SealedStoreError(f"the index does not load: {type(exc).__name__}") from None
        n = len(index._keys)
        if index._rows.shape != (n, index.dim) or index._live.shape != (n,) or graph.ntotal != n:
            raise SealedStoreError("the index's parts disagree in size")
        graph.hnsw.efConstruction = index.settings.ef_construction
        index._graph = graph
        index._row_of = {int(k): i for i, k in enumerate(index._keys) if index._live[i]}
        return index
