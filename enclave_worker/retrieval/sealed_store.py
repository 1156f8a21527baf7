"""Sealed snapshots of a vector store (its files' chunks and the index): what leaves the worker for
the operator's disk. AES-256-GCM in segments under a key derived (HKDF) from the store key, which
only an attested worker holds; every segment's associated data binds the store id, the snapshot's
version, the segment's position and whether it is the last, so a segment cannot be moved between
stores, versions or positions, dropped from the end, or reordered. The header (magic, version,
segment count, plaintext size) is in the clear: it is what the operator sees, with the sizes."""

from __future__ import annotations

import struct

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from .errors import SealedStoreError

MAGIC = b"SVS1"
SEGMENT_SIZE = 1 << 20
_HEADER = struct.Struct(">4sQIQ")  # magic, version, segments, plaintext bytes
_TAG = 16


def _aead(store_key: bytes, store_id: str) -> AESGCM:
    if len(store_key) != 32:
        raise SealedStoreError("the store key must be 32 bytes")
    return AESGCM(HKDF(hashes.SHA256(), 32, store_id.encode(), b"sealed vector store v1").derive(store_key))


def _nonce(index: int, final: bool) -> bytes:
    return index.to_bytes(8, "big") + (b"\x01" if final else b"\x00") + b"\x00\x00\x00"


def _ad(store_id: str, header: bytes, index: int, final: bool) -> bytes:
    return b"sealed-vs-segment\x00" + store_id.encode() + b"\x00" + header + index.to_bytes(8, "big") + bytes([final])


def seal_snapshot(store_key: bytes, store_id: str, version: int, plaintext: bytes) -> bytes:
    aead = _aead(store_key, store_id)
    segments = max(1, -(-len(plaintext) // SEGMENT_SIZE))
    header = _HEADER.pack(MAGIC, version, segments, len(plaintext))
    out = [header]
    for i in range(segments):
        final = i == segments - 1
        piece = plaintext[i * SEGMENT_SIZE:(i + 1) * SEGMENT_SIZE]
        out.append(aead.encrypt(_nonce(i, final), piece, _ad(store_id, header, i, final)))
    return b"".join(out)


def snapshot_version(blob: bytes) -> int:
    """The version a snapshot's (clear) header claims; opening it checks the claim."""
    if len(blob) < _HEADER.size:
        raise SealedStoreError("the snapshot is truncated")
    return int(_HEADER.unpack(blob[:_HEADER.size])[1])


def open_snapshot(store_key: bytes, store_id: str, blob: bytes, min_version: int = 0) -> tuple[int, bytes]:
    """(version, plaintext) of a sealed snapshot of ``store_id``; an older version than ``min_version``
    (one this worker has already seen: a replayed snapshot) is refused, as is anything tampered."""
    if len(blob) < _HEADER.size:
        raise SealedStoreError("the snapshot is truncated")
    header = blob[:_HEADER.size]
    magic, version, segments, size = _HEADER.unpack(header)
    if magic != MAGIC:
        raise SealedStoreError("not a sealed vector store snapshot")
    if version < min_version:
        raise SealedStoreError(f"the snapshot is version {version}; this store is at version {min_version}")
    expected = size + segments * _TAG
    if segments != max(1, -(-size // SEGMENT_SIZE)) or len(blob) - _HEADER.size != expected:
        raise SealedStoreError("the snapshot's size does not match its header")
    aead = _aead(store_key, store_id)
    parts, cursor = [], _HEADER.size
    for i in range(segments):
        final = i == segments - 1
        length = (size - i * SEGMENT_SIZE if final else SEGMENT_SIZE) + _TAG
        try:
            parts.append(aead.decrypt(_nonce(i, final), blob[cursor:cursor + length], _ad(store_id, header, i, final)))
        except InvalidTag:
            raise SealedStoreError("the snapshot does not open: another key or store, or tampered") from None
        cursor += length
    return version, b"".join(parts)
