"""The retrieval package's one error tree. Messages name what is wrong with a request or a snapshot,
never a document's text."""

from __future__ import annotations


class RetrievalError(Exception):
    """Base of every error of enclave_worker.retrieval."""


class InvalidRetrievalRequest(RetrievalError):
    """A chunking strategy, filter, attribute set or search request that breaks the API's rules (400)."""


class SealedStoreError(RetrievalError):
    """A sealed snapshot that does not open: another key, another store, tampered, truncated or
    reordered segments, or an older version than the one asked for."""


class StaleSnapshot(SealedStoreError):
    """A store snapshot older than one this worker has already seen for that store: a replay (it
    would bring a deleted file back), refused whatever the gateway sends with it."""


class SnapshotNeeded(RetrievalError):
    """The worker does not hold the store snapshot the gateway named (never seen, evicted, or one
    of another digest): the gateway sends it (WriteStoreSnapshot) and asks again."""
