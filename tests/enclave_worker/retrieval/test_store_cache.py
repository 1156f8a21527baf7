"""The worker's open vector stores (enclave_worker/retrieval/store_cache.py): served only at the exact
snapshot named (id, version, digest), bounded by bytes with the least recently used out first, and
a snapshot made for the gateway held until it is read."""

from __future__ import annotations

from enclave_worker.retrieval.store_cache import StoreCache, StoreCacheSettings
from enclave_worker.retrieval.vector_store import VectorStore
from protocol.rpc.snapshot_segments import SnapshotName


def _store(store_id: str) -> VectorStore:
    return VectorStore(store_id, 8)


def test_a_store_is_served_only_at_the_snapshot_named() -> None:
    cache = StoreCache()
    name = SnapshotName("vs_1", 3, b"a" * 32)
    store = _store("vs_1")
    cache.put(name, store, 100)
    assert cache.get(name) is store
    for other in (
        SnapshotName("vs_1", 2, b"a" * 32),
        SnapshotName("vs_1", 4, b"a" * 32),
        SnapshotName("vs_1", 3, b"b" * 32),
        SnapshotName("vs_2", 3, b"a" * 32),
    ):
        assert cache.get(other) is None, other
    newer = SnapshotName("vs_1", 4, b"c" * 32)
    cache.put(newer, store, 100)  # one entry per store: the older snapshot is no longer served
    assert cache.get(name) is None and cache.get(newer) is store and len(cache) == 1


def test_bounded_by_bytes_least_recently_used_out_first() -> None:
    cache = StoreCache(StoreCacheSettings(max_bytes=250))
    names = [SnapshotName(f"vs_{i}", 1, bytes([i]) * 32) for i in range(3)]
    cache.put(names[0], _store("vs_0"), 100)
    cache.put(names[1], _store("vs_1"), 100)
    assert cache.get(names[0]) is not None  # vs_0 used: vs_1 is now the least recently used
    cache.put(names[2], _store("vs_2"), 100)
    assert cache.get(names[1]) is None and cache.get(names[0]) is not None and cache.get(names[2]) is not None
    assert cache.held_bytes == 200
    big = SnapshotName("vs_big", 1, b"z" * 32)
    cache.put(big, _store("vs_big"), 400)  # over the bound alone: kept (the call needs it), the rest out
    assert cache.get(big) is not None and len(cache) == 1


def test_a_made_snapshot_is_held_until_read_and_counts_against_the_bound() -> None:
    cache = StoreCache(StoreCacheSettings(max_bytes=1000))
    name = SnapshotName("vs_1", 2, b"d" * 32)
    cache.put(name, _store("vs_1"), 300, unread=b"s" * 300)
    assert cache.held_bytes == 600
    assert cache.unread(SnapshotName("vs_1", 2, b"e" * 32)) == b""  # another digest: not this one
    assert cache.unread(name) == b"s" * 300
    cache.read(name)
    assert cache.unread(name) == b"" and cache.held_bytes == 300 and cache.get(name) is not None
    cache.clear()
    assert cache.get(name) is None and cache.held_bytes == 0


def test_a_pinned_store_is_not_evicted_for_space_but_a_change_or_a_wipe_still_replaces_it() -> None:
    cache = StoreCache(StoreCacheSettings(max_bytes=250))
    names = [SnapshotName(f"vs_{i}", 1, bytes([i]) * 32) for i in range(3)]
    cache.put(names[0], _store("vs_0"), 100)
    cache.pin("vs_0")  # a sealed search between its check and its search
    cache.pin("vs_0")
    cache.put(names[1], _store("vs_1"), 100)
    cache.put(names[2], _store("vs_2"), 100)  # vs_0 is the least recently used, but pinned: vs_1 goes
    assert cache.get(names[0]) is not None and cache.get(names[1]) is None
    cache.unpin("vs_0")
    assert cache.pinned("vs_0") == 1
    cache.put(names[1], _store("vs_1"), 100)  # still pinned once: vs_2 goes
    assert cache.get(names[0]) is not None and cache.get(names[2]) is None
    cache.unpin("vs_0")
    assert cache.pinned("vs_0") == 0
    cache.get(names[1])
    cache.put(names[2], _store("vs_2"), 100)  # unpinned: evicted as any other
    assert cache.get(names[0]) is None
    cache.pin("vs_1")
    newer = SnapshotName("vs_1", 2, b"n" * 32)
    cache.put(newer, _store("vs_1"), 100)  # a change replaces the pinned snapshot: the old name is not served
    assert cache.get(names[1]) is None and cache.get(newer) is not None
    cache.clear()  # a wipe drops pinned stores too
    assert len(cache) == 0
