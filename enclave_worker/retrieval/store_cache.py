"""The vector stores a worker holds open in memory, so that a search or an ingestion over an
unchanged store neither receives, hashes nor opens its sealed snapshot again (issue #51: the
snapshot travelling on every call made search 3.5x plain faiss at 4,000 chunks).

An entry is one store at one snapshot: its id, version and the SHA-256 of the sealed snapshot the
gateway holds. It is served only when all three match what the gateway names; any difference is a
miss, and the caller then needs the snapshot itself. Bounded by bytes (the sealed snapshot's size
stands for the opened store's, which is about the same: chunks' text and the index), least
recently used first out. Also kept: a snapshot this worker just made, until the gateway reads it
(ReadStoreSnapshot); it counts against the bound too. A store can be pinned (a sealed search between
its check that the store is held, made before its envelope opens, and its search) so that no other
store's load evicts it meanwhile; a change or a wipe still replaces or drops it. Cleared whole when
the data key is wiped or changes (RetrievalService), so nothing opened under a revoked key stays in memory."""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

from protocol.rpc.snapshot_segments import SnapshotName

from .vector_store import VectorStore

DEFAULT_CACHE_BYTES = 1 << 30


@dataclass(frozen=True)
class StoreCacheSettings:
    max_bytes: int = DEFAULT_CACHE_BYTES  # opened stores and unread snapshots, all stores together


@dataclass
class CachedStore:
    name: SnapshotName
    store: VectorStore
    size: int  # the sealed snapshot's bytes
    unread: bytes = b""  # a snapshot this worker made, until the gateway has read it

    @property
    def held_bytes(self) -> int:
        return self.size + len(self.unread)


class StoreCache:
    def __init__(self, settings: StoreCacheSettings | None = None) -> None:
        self.settings = settings or StoreCacheSettings()
        self._entries: OrderedDict[str, CachedStore] = OrderedDict()  # store id -> its one open snapshot
        self._pins: dict[str, int] = {}  # store id -> sealed searches between their check and their search
        # Pins change on the calls' thread and, released, on the event loop (which must not wait for
        # the calls' lock: an ingest holds it for seconds), so they have their own.
        self._pin_lock = threading.Lock()

    def get(self, name: SnapshotName) -> VectorStore | None:
        """The store open at exactly ``name`` (id, version and digest), or None."""
        entry = self._entries.get(name.store_id)
        if entry is None or entry.name != name:
            return None
        self._entries.move_to_end(name.store_id)
        return entry.store

    def put(self, name: SnapshotName, store: VectorStore, size: int, unread: bytes = b"") -> None:
        """``store`` open at ``name``; replaces whatever this store's entry held."""
        self._entries[name.store_id] = CachedStore(name, store, size, unread)
        self._entries.move_to_end(name.store_id)
        self._shrink(keep=name.store_id)

    def unread(self, name: SnapshotName) -> bytes:
        """The snapshot made at ``name`` that the gateway has not read yet (b"": none)."""
        entry = self._entries.get(name.store_id)
        return entry.unread if entry is not None and entry.name == name else b""

    def read(self, name: SnapshotName) -> None:
        """The gateway has the snapshot: its bytes need not be kept."""
        entry = self._entries.get(name.store_id)
        if entry is not None and entry.name == name:
            entry.unread = b""

    def pin(self, store_id: str) -> None:
        """Not evicted for space until as many ``unpin``s (a change or ``clear`` still drops it)."""
        with self._pin_lock:
            self._pins[store_id] = self._pins.get(store_id, 0) + 1

    def unpin(self, store_id: str) -> None:
        with self._pin_lock:
            left = self._pins.pop(store_id, 0) - 1
            if left > 0:
                self._pins[store_id] = left

    def pinned(self, store_id: str) -> int:
        return self._pins.get(store_id, 0)

    def drop(self, store_id: str) -> None:
        self._entries.pop(store_id, None)

    def clear(self) -> None:
        self._entries.clear()

    @property
    def held_bytes(self) -> int:
        return sum(e.held_bytes for e in self._entries.values())

    def __len__(self) -> int:
        return len(self._entries)

    def _shrink(self, keep: str) -> None:
        """Least recently used out until under the bound. The entry just put stays even when it alone
        is over the bound: the call in progress and the gateway's read of its new snapshot need it;
        so do pinned ones (a sealed search about to use it)."""
        total = self.held_bytes
        for store_id in list(self._entries):
            if total <= self.settings.max_bytes:
                return
            if store_id != keep and not self.pinned(store_id):
                total -= self._entries.pop(store_id).held_bytes
