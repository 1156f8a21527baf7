"""A sealed store snapshot in segments (protocol/rpc/snapshot_segments.py): it arrives whole or not
at all. Every way a list can be wrong is refused by name: truncated, reordered, a gap, a segment of
another snapshot, more bytes than announced, over the bound, a digest that differs."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable

import pytest

from protocol.rpc import worker_pb2
from protocol.rpc.snapshot_segments import SegmentAssembler, SnapshotName, SnapshotTransferError, segments

BLOB = os.urandom(10_000)
NAME = SnapshotName("vs_1", 7, hashlib.sha256(BLOB).digest())
Segments = list[worker_pb2.StoreSnapshotSegment]


def _split(blob: bytes = BLOB, name: SnapshotName = NAME, size: int = 3000) -> Segments:
    return list(segments("acme", name, blob, size))


def _assemble(parts: Segments, max_bytes: int = 1 << 20) -> tuple[str, SnapshotName, bytes]:
    assembler = SegmentAssembler(max_bytes)
    for part in parts:
        assembler.add(part)
    return assembler.finish()


def test_a_snapshot_in_segments_arrives_whole() -> None:
    parts = _split()
    assert [p.index for p in parts] == [0, 1, 2, 3] and {p.count for p in parts} == {4}
    assert _assemble(parts) == ("acme", NAME, BLOB)
    empty = SnapshotName("vs_1", 0, hashlib.sha256(b"").digest())
    assert _assemble(_split(b"", empty)) == ("acme", empty, b"")


def _other_snapshot(parts: Segments) -> Segments:
    stranger = _split(name=SnapshotName("vs_2", 7, NAME.sha256))
    return [parts[0], stranger[1], *parts[2:]]


def _more_bytes(parts: Segments) -> Segments:
    parts[-1].data += b"x"
    return parts


def _flipped_byte(parts: Segments) -> Segments:
    parts[1].data = bytes([parts[1].data[0] ^ 1]) + parts[1].data[1:]
    return parts


CASES: dict[str, tuple[Callable[[Segments], Segments], str]] = {
    "truncated: last segment dropped": (lambda p: p[:-1], "truncated"),
    "truncated: no segment": (lambda p: [], "no segment"),
    "reordered": (lambda p: [p[0], p[2], p[1], p[3]], "reordered or missing"),
    "a gap": (lambda p: [p[0], p[1], p[3]], "reordered or missing"),
    "starts past 0": (lambda p: p[1:], "number 0"),
    "a segment repeated": (lambda p: [p[0], p[1], p[1], p[2], p[3]], "reordered or missing"),
    "a segment of another snapshot": (_other_snapshot, "another snapshot"),
    "more bytes than announced": (_more_bytes, "more bytes"),
    "a byte changed": (_flipped_byte, "SHA-256"),
}


@pytest.mark.parametrize("case", CASES)
def test_a_wrong_segment_list_is_refused(case: str) -> None:
    change, message = CASES[case]
    with pytest.raises(SnapshotTransferError, match=message):
        _assemble(change(_split()))


def test_the_bounds_are_explicit() -> None:
    with pytest.raises(SnapshotTransferError, match="at most 9999 bytes"):
        _assemble(_split(), max_bytes=9_999)
    flood = _split()
    for part in flood:
        part.count = 1_000_000  # a million segments announced for 10 kB
    with pytest.raises(SnapshotTransferError, match="segment count"):
        _assemble(flood)
    extra = _split()
    extra.append(
        worker_pb2.StoreSnapshotSegment(tenant="acme", ref=NAME.ref(), index=4, count=4, total_bytes=len(BLOB))
    )
    with pytest.raises(SnapshotTransferError, match="more segments than announced"):
        _assemble(extra)
