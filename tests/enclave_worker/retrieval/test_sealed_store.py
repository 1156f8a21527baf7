"""Sealed snapshots: what opens, and the table of what must not."""

from __future__ import annotations

import os

import pytest

from enclave_worker.retrieval.errors import SealedStoreError
from enclave_worker.retrieval.sealed_store import SEGMENT_SIZE, open_snapshot, seal_snapshot

KEY = bytes(range(32))
PLAINTEXT = os.urandom(2 * SEGMENT_SIZE + 1234)  # three segments, the last one short


def test_round_trip_and_ciphertext_only() -> None:
    blob = seal_snapshot(KEY, "vs_1", 7, PLAINTEXT)
    assert PLAINTEXT[:64] not in blob and open_snapshot(KEY, "vs_1", blob, min_version=7) == (7, PLAINTEXT)
    assert open_snapshot(KEY, "vs_1", seal_snapshot(KEY, "vs_1", 1, b"")) == (1, b"")


def _flip(blob: bytes, at: int) -> bytes:
    return blob[:at] + bytes([blob[at] ^ 1]) + blob[at + 1:]


BLOB = seal_snapshot(KEY, "vs_1", 7, PLAINTEXT)
SEG = SEGMENT_SIZE + 16
HEAD = 24


@pytest.mark.parametrize(("key", "store", "blob", "min_version", "message"), [
    (bytes(32), "vs_1", BLOB, 0, "another key or store"),
    (KEY, "vs_2", BLOB, 0, "another key or store"),
    (KEY, "vs_1", _flip(BLOB, HEAD + 5), 0, "tampered"),
    (KEY, "vs_1", _flip(BLOB, len(BLOB) - 1), 0, "tampered"),
    (KEY, "vs_1", BLOB[:HEAD] + BLOB[HEAD + SEG:HEAD + 2 * SEG] + BLOB[HEAD:HEAD + SEG] + BLOB[HEAD + 2 * SEG:],
     0, "tampered"),  # two segments swapped
    (KEY, "vs_1", BLOB[:-10], 0, "size does not match"),
    (KEY, "vs_1", BLOB[:10], 0, "truncated"),
    (KEY, "vs_1", b"XXXX" + BLOB[4:], 0, "not a sealed vector store"),
    (KEY, "vs_1", _flip(BLOB, 11), 0, ""),  # the version in the header: bound into every segment
    (KEY, "vs_1", BLOB, 8, "version 7; this store is at version 8"),  # a replayed older snapshot
    (b"short", "vs_1", BLOB, 0, "32 bytes"),
])
def test_what_does_not_open(key: bytes, store: str, blob: bytes, min_version: int, message: str) -> None:
    with pytest.raises(SealedStoreError, match=message):
        open_snapshot(key, store, blob, min_version)


def test_a_cut_after_a_whole_segment_is_refused() -> None:
    """Dropping the last segments leaves whole segments, but none marked final: the header's count
    and the final flag in the associated data both refuse it."""
    cut = BLOB[:HEAD + 2 * SEG]
    with pytest.raises(SealedStoreError):
        open_snapshot(KEY, "vs_1", cut)
