"""A sealed vector store snapshot in transit between the gateway and a worker, as segments
(WriteStoreSnapshot, ReadStoreSnapshot): a snapshot may be larger than one gRPC message, and no
message limit is raised to carry it. Both ends use the same rules.

The receiver takes segments in order and refuses, before anything is opened: a first segment that
is not number 0, a gap or a reordering, a segment that names another store, version, digest, count
or size than the first, more bytes than announced, more than ``max_bytes`` in all, and at the end
fewer segments or bytes than announced (a truncated list) or bytes whose SHA-256 is not the one
named. The snapshot's own AEAD (enclave_worker/retrieval/sealed_store.py) is checked by the worker
when it opens it; the digest here is what the gateway can check too (it holds no key)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass

from protocol.rpc import worker_pb2

SEGMENT_BYTES = 4 << 20  # well under the 32 MiB message limit of both ends
MIN_SEGMENT_BYTES = 1024  # bounds the count a sender may announce: no flood of empty segments
MAX_SNAPSHOT_BYTES = 1 << 30  # a store's whole sealed snapshot (about 470,000 chunks of 100 tokens)


class SnapshotTransferError(ValueError):
    """A segment list that is not one whole snapshot as announced (the message says what)."""


@dataclass(frozen=True)
class SnapshotName:
    store_id: str
    version: int
    sha256: bytes

    @classmethod
    def of(cls, ref: worker_pb2.StoreSnapshotRef) -> SnapshotName:
        return cls(ref.store_id, ref.version, bytes(ref.sha256))

    def ref(self) -> worker_pb2.StoreSnapshotRef:
        return worker_pb2.StoreSnapshotRef(store_id=self.store_id, version=self.version, sha256=self.sha256)


def segments(
    tenant: str, name: SnapshotName, blob: bytes, segment_bytes: int | None = None
) -> Iterator[worker_pb2.StoreSnapshotSegment]:
    """``blob`` as segments of at most ``segment_bytes`` (SEGMENT_BYTES; an empty blob: one empty segment)."""
    segment_bytes = segment_bytes or SEGMENT_BYTES
    count = max(1, -(-len(blob) // segment_bytes))
    ref = name.ref()
    for i in range(count):
        yield worker_pb2.StoreSnapshotSegment(
            tenant=tenant,
            ref=ref,
            index=i,
            count=count,
            total_bytes=len(blob),
            data=blob[i * segment_bytes : (i + 1) * segment_bytes],
        )


class SegmentAssembler:
    """Feed segments in the order they arrived (``add``), then ``finish`` for the whole blob."""

    def __init__(self, max_bytes: int = MAX_SNAPSHOT_BYTES) -> None:
        self.max_bytes = max_bytes
        self.tenant = ""
        self.name: SnapshotName | None = None
        self._count = self._total = 0
        self._parts: list[bytes] = []
        self._received = 0

    def add(self, segment: worker_pb2.StoreSnapshotSegment) -> None:
        if self.name is None:
            if segment.index != 0:
                raise SnapshotTransferError("the first segment of a snapshot must be number 0")
            if segment.total_bytes > self.max_bytes:
                raise SnapshotTransferError(f"a snapshot may have at most {self.max_bytes} bytes")
            if segment.count < 1 or segment.count > max(1, -(-segment.total_bytes // MIN_SEGMENT_BYTES)):
                raise SnapshotTransferError("the segment count announced does not fit the snapshot's size")
            self.tenant, self.name = segment.tenant, SnapshotName.of(segment.ref)
            self._count, self._total = segment.count, segment.total_bytes
        elif (segment.tenant, SnapshotName.of(segment.ref), segment.count, segment.total_bytes) != (
            self.tenant,
            self.name,
            self._count,
            self._total,
        ):
            raise SnapshotTransferError("a segment names another snapshot than the first")
        if segment.index != len(self._parts):
            raise SnapshotTransferError(
                f"segment {segment.index} arrived where {len(self._parts)} was due (reordered or missing)"
            )
        if segment.index >= self._count:
            raise SnapshotTransferError("more segments than announced")
        self._received += len(segment.data)
        if self._received > self._total:
            raise SnapshotTransferError("more bytes than announced")
        self._parts.append(bytes(segment.data))

    def finish(self) -> tuple[str, SnapshotName, bytes]:
        """(tenant, name, blob) once every segment arrived and the digest matches."""
        if self.name is None:
            raise SnapshotTransferError("no segment arrived")
        if len(self._parts) != self._count or self._received != self._total:
            raise SnapshotTransferError(
                f"the snapshot is truncated: {len(self._parts)} of {self._count} segments, "
                f"{self._received} of {self._total} bytes"
            )
        blob = b"".join(self._parts)
        self._parts = []
        if hashlib.sha256(blob).digest() != self.name.sha256:
            raise SnapshotTransferError("the snapshot's SHA-256 is not the one named")
        return self.tenant, self.name, blob
