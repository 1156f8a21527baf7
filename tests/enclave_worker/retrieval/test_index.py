"""The faiss-backed index: recall against exact search, rights and removals inside the search,
round trip through bytes, refusals."""

from __future__ import annotations

import io

import numpy as np
import pytest

from enclave_worker.retrieval.errors import InvalidRetrievalRequest, SealedStoreError
from enclave_worker.retrieval.index import IndexSettings, VectorIndex

DIM = 64
GRAPH_ONLY = IndexSettings(exact_below=0)  # every search walks the graph


def _clustered(n: int, seed: int) -> np.ndarray:
    """Vectors like sentence embeddings: clusters of topics, normalized."""
    rng = np.random.default_rng(seed)
    centers = rng.standard_normal((50, DIM)).astype(np.float32)
    x = centers[rng.integers(0, 50, n)] + 0.7 * rng.standard_normal((n, DIM)).astype(np.float32)
    normalized: np.ndarray = x / np.linalg.norm(x, axis=1, keepdims=True)
    return normalized


@pytest.fixture(scope="module")
def data() -> tuple[np.ndarray, np.ndarray]:
    return _clustered(6000, 0), _clustered(100, 1)


@pytest.fixture(scope="module")
def index(data: tuple[np.ndarray, np.ndarray]) -> VectorIndex:
    idx = VectorIndex(DIM, GRAPH_ONLY)
    idx.add(range(len(data[0])), data[0])
    return idx


def test_recall_at_10_against_exact_search(index: VectorIndex, data: tuple[np.ndarray, np.ndarray]) -> None:
    vectors, queries = data
    exact = np.argsort(-(queries @ vectors.T), axis=1)[:, :10]
    found = [[h.key for h in index.search(q, 10)] for q in queries]
    recall = np.mean([len(set(f) & set(e)) / 10 for f, e in zip(found, exact, strict=True)])
    assert recall >= 0.95


@pytest.mark.parametrize("settings", [GRAPH_ONLY, IndexSettings()], ids=["graph", "exact-scan"])
def test_only_allowed_keys_are_returned(data: tuple[np.ndarray, np.ndarray], settings: IndexSettings) -> None:
    vectors, queries = data
    idx = VectorIndex(DIM, settings)
    idx.add(range(2000), vectors[:2000])
    allowed = set(range(0, 2000, 7))
    for q in queries[:20]:
        hits = idx.search(q, 10, allowed)
        assert len(hits) == 10 and {h.key for h in hits} <= allowed
        best = max(allowed, key=lambda k: float(vectors[k] @ q))
        assert hits[0].key == best or settings is GRAPH_ONLY
    assert idx.search(queries[0], 10, set()) == []
    assert idx.search(queries[0], 10, {99999}) == []  # unknown keys allow nothing


def test_removed_keys_are_gone_at_once_and_after_compaction(data: tuple[np.ndarray, np.ndarray]) -> None:
    vectors, queries = data
    idx = VectorIndex(DIM, IndexSettings(exact_below=0, compact_fraction=0.5))
    idx.add(range(1000), vectors[:1000])
    target = idx.search(queries[0], 1)[0].key
    assert idx.remove([target, 5000]) == 1
    assert target not in {h.key for h in idx.search(queries[0], 50)} and len(idx) == 999
    idx.remove(range(0, 1000, 2))  # past half: the graph is rebuilt from the live rows
    assert len(idx) == len(set(range(1, 1000, 2)) - {target})
    assert all(h.key % 2 == 1 and h.key != target for h in idx.search(queries[1], 50))


def test_round_trip_through_bytes(index: VectorIndex, data: tuple[np.ndarray, np.ndarray]) -> None:
    copy = VectorIndex.from_bytes(index.to_bytes(), GRAPH_ONLY)
    assert len(copy) == len(index)
    for q in data[1][:10]:
        assert copy.search(q, 10) == index.search(q, 10)


def _npz(blob: bytes) -> dict[str, np.ndarray]:
    with np.load(io.BytesIO(blob), allow_pickle=False) as parts:
        return {name: parts[name] for name in parts.files}


def _with_rows(blob: bytes, rows: np.ndarray) -> bytes:
    """``blob`` as the index wrote it before it left the rows out: the rows beside the graph."""
    parts, out = _npz(blob), io.BytesIO()
    np.savez(out, rows=rows, keys=parts["keys"], live=parts["live"], graph=parts["graph"], dim=parts["dim"])
    return out.getvalue()


def test_bytes_carry_the_rows_once_and_give_them_back_exactly(data: tuple[np.ndarray, np.ndarray]) -> None:
    """The rows are the graph's own vectors on load (not written twice), the same bits, removals and
    a compaction included, so the exact scan and a later compaction see what was added."""
    vectors, queries = data
    idx = VectorIndex(DIM, IndexSettings(compact_fraction=0.5))
    idx.add(range(600), vectors[:600])
    idx.remove(range(0, 600, 3))  # a third gone: kept as removed rows
    blob = idx.to_bytes()
    assert "rows" not in _npz(blob)
    copy = VectorIndex.from_bytes(blob)
    assert copy._rows.dtype == np.float32 and np.array_equal(copy._rows, idx._rows)
    assert np.array_equal(copy._rows[copy._row_of[1]], vectors[1])
    for q in queries[:5]:  # exact scan (600 rows): over the reconstructed rows
        assert copy.search(q, 10) == idx.search(q, 10)
    copy.remove(range(1, 600, 3))  # past half: the graph is rebuilt from the reconstructed rows
    assert np.array_equal(copy._rows, vectors[2:600:3])
    assert len(_with_rows(blob, idx._rows)) - len(blob) >= idx._rows.nbytes  # the rows' bytes, not written


def test_bytes_written_with_the_rows_still_load(index: VectorIndex, data: tuple[np.ndarray, np.ndarray]) -> None:
    """A snapshot sealed before the rows were left out (rows beside the graph) opens the same."""
    copy = VectorIndex.from_bytes(_with_rows(index.to_bytes(), index._rows), GRAPH_ONLY)
    assert np.array_equal(copy._rows, index._rows)
    for q in data[1][:10]:
        assert copy.search(q, 10) == index.search(q, 10)


def test_rows_that_disagree_with_the_graph_are_refused(index: VectorIndex) -> None:
    with pytest.raises(SealedStoreError, match="disagree"):
        VectorIndex.from_bytes(_with_rows(index.to_bytes(), index._rows[:-1]))


def test_bad_additions_and_queries_are_refused() -> None:
    idx = VectorIndex(DIM)
    idx.add([1], np.ones((1, DIM), np.float32) / 8)
    cases = [
        (lambda: idx.add([2, 3], np.ones((1, DIM), np.float32)), "expected 2 vectors"),
        (lambda: idx.add([2], np.ones((1, DIM + 1), np.float32)), "expected 1 vectors of 64"),
        (lambda: idx.add([2], np.full((1, DIM), np.nan, np.float32)), "finite"),
        (lambda: idx.add([1], np.ones((1, DIM), np.float32)), "new and distinct"),
        (lambda: idx.add([4, 4], np.ones((2, DIM), np.float32)), "new and distinct"),
        (lambda: idx.search(np.ones(DIM - 1), 1), "64 finite values"),
        (lambda: idx.search(np.full(DIM, np.inf), 1), "64 finite values"),
        (lambda: idx.search(np.ones(DIM), 0), "k must be positive"),
    ]
    for call, message in cases:
        with pytest.raises(InvalidRetrievalRequest, match=message):
            call()
    assert len(idx) == 1  # nothing refused was added


@pytest.mark.parametrize("blob", [b"", b"garbage", b"PK\x03\x04" + b"\x00" * 40])
def test_unloadable_bytes_are_refused(blob: bytes) -> None:
    with pytest.raises(SealedStoreError):
        VectorIndex.from_bytes(blob)


@pytest.mark.parametrize("settings", [GRAPH_ONLY, IndexSettings()])
def test_allowed_keys_in_any_order_map_to_their_rows(settings: IndexSettings) -> None:
    # Keys added out of order, some removed, the allowed list holding unknown and removed keys: the
    # search (keys mapped to rows in numpy) answers exactly what exact search over the allowed live rows does.
    vectors = _clustered(600, 3)
    keys = np.random.default_rng(4).permutation(np.arange(10_000, 10_600)) * 7
    idx = VectorIndex(DIM, settings)
    idx.add(keys.tolist(), vectors)
    removed = set(keys[:50].tolist())
    idx.remove(removed)
    allowed = [int(k) for k in keys[::2]] + [1, 3, 5]  # every other key, some removed, three never added
    live = [i for i, k in enumerate(keys.tolist()) if k in set(allowed) and k not in removed]
    query = _clustered(1, 5)[0]
    want = sorted(live, key=lambda i: -float(vectors[i] @ query))[:5]
    for given in (allowed, np.array(allowed, dtype=np.int64)):
        hits = idx.search(query, 5, given)
        assert {h.key for h in hits} <= {int(keys[i]) for i in live}  # never a key outside the allowed live ones
        if settings.exact_below:
            assert [h.key for h in hits] == [int(keys[i]) for i in want]
    idx.add([10, 3], _clustered(2, 6))  # a change after a search: the key map is made again
    assert any(h.key == 3 for h in idx.search(_clustered(2, 6)[1], 600, [3]))
    assert idx.search(query, 5, [10_000_000]) == []
