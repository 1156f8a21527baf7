"""A package decrypted tensor by tensor as the engine's build takes it (issue 49), not all at once.

`decrypt_package` fills one plaintext buffer before the build starts, so a bf16 package quantized to
int8 at load peaks at the whole bf16 buffer beside the first codes. Here the buffer is reserved
(`torch.empty`: virtual memory, no page touched) and each tensor's segments are decrypted into their
places in it when the builder takes the tensor; the page release (page_release.py) gives them back
once the layer is built, so the load holds the weights as built plus about one layer of plaintext.

The package's rule stays: nothing is used before the whole payload is authenticated and its plaintext
digest matches the signed manifest. So a first pass (`verify`) decrypts every segment into one
segment-sized scratch buffer (zeroed after), checks every tag and the digest, and records a BLAKE3
digest of each segment's plaintext. The second pass (`PackageStream.take`) reads each segment from the
file again, checks its tag, and compares its plaintext with the first pass's digest: the file is the
operator's and may change between the passes, and a GCM tag does not bind the plaintext against a
holder of the data key (docs/package-format.md, "Can the per-segment tags replace the plaintext
hash?"), so the digest does. A segment that differs is zeroed and refused with PackageIntegrityError;
the worker then wipes what it had decrypted (`wipe`) and serves nothing. Cost: every segment is read
and decrypted twice and hashed three times (docs/package-format.md, "Streamed load").
"""

from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Callable, Iterator
from functools import partial
from io import RawIOBase
from pathlib import Path

import blake3
import torch
from cryptography.hazmat.primitives.ciphers import algorithms

from enclave_worker.package.page_release import PageRelease
from enclave_worker.package.segments import check_digest, decrypt_segment, decrypt_segments
from protocol.package.errors import PackageIntegrityError
from protocol.package.format import TAG_BYTES, Manifest, TensorEntry, ad_prefix, new_hasher, segment_key

_SLACK = 32  # update_into may need up to a block of headroom past the segment


def verify(fh: RawIOBase, manifest: Manifest, manifest_bytes: bytes, data_key: bytes) -> list[bytes]:
    """First pass: authenticate every segment and the signed plaintext digest, keeping no plaintext;
    returns each segment's BLAKE3 digest for the second pass."""
    scratch = bytearray(manifest.segment_size + _SLACK)
    view = memoryview(scratch)
    hasher = new_hasher(manifest.digest_alg)
    digests: list[bytes] = []
    try:
        for _, plaintext in decrypt_segments(fh, manifest, manifest_bytes, data_key, lambda _i: view):
            hasher.update(plaintext)
            digests.append(blake3.blake3(plaintext).digest())
    finally:
        ctypes.memset((ctypes.c_char * len(scratch)).from_buffer(scratch), 0, len(scratch))
        view.release()
    check_digest(hasher, manifest)
    return digests


def _pread_exact(fd: int, view: memoryview, offset: int) -> int:
    got = 0
    while got < len(view):
        n = os.preadv(fd, [view[got:]], offset + got)
        if not n:
            break
        got += n
    return got


class PackageStream:
    """The second pass: each tensor's segments decrypted into the reserved buffer when taken."""

    def __init__(
        self,
        pkg_dir: Path,
        manifest: Manifest,
        manifest_bytes: bytes,
        data_key: bytes,
        digests: list[bytes],
        buffer: torch.Tensor,
    ) -> None:
        self._payload = Path(pkg_dir) / "payload.bin"
        self.manifest = manifest
        self.buffer = buffer
        self.release = PageRelease(buffer)
        self._prefix = ad_prefix(manifest.package_id, manifest_bytes)
        self._algorithm: algorithms.AES | None = algorithms.AES(segment_key(data_key, manifest.package_id))
        self._digests = digests
        self._done: set[int] = set()  # segments decrypted and checked (never decrypted twice)
        self._lock = threading.Lock()
        self._out = buffer.numpy().data.cast("B")

    def _segments(self, offset: int, nbytes: int) -> range:
        size = self.manifest.segment_size
        return range(offset // size, (offset + max(nbytes, 1) - 1) // size + 1)

    def ensure(self, offset: int, nbytes: int) -> None:
        """Decrypt and check the segments [offset, offset + nbytes) lies in, those not done yet."""
        with self._lock:
            todo = [i for i in self._segments(offset, nbytes) if i not in self._done]
            if not todo:
                return
            if self._algorithm is None:
                raise PackageIntegrityError("the package stream is closed: the build took a tensor after it")
            m, size = self.manifest, self.manifest.segment_size
            ct = bytearray(size + TAG_BYTES)
            fd = os.open(self._payload, os.O_RDONLY)
            try:
                for i in todo:
                    self._one(fd, memoryview(ct), i, m.segment_len(i), i * size)
            finally:
                os.close(fd)

    def _one(self, fd: int, ct: memoryview, i: int, n: int, start: int) -> None:
        m = self.manifest
        if _pread_exact(fd, ct[: n + TAG_BYTES], i * (m.segment_size + TAG_BYTES)) != n + TAG_BYTES:
            raise PackageIntegrityError(f"segment {i} is short")
        assert self._algorithm is not None
        try:
            decrypt_segment(
                self._algorithm, self._prefix, i, i == m.num_segments - 1, ct[: n + TAG_BYTES], self._out[start:]
            )
            if blake3.blake3(self._out[start : start + n]).digest() != self._digests[i]:
                raise PackageIntegrityError(f"segment {i} differs from the one authenticated before the load")
        except BaseException:
            self.buffer[start : start + n].zero_()  # unauthenticated or substituted plaintext
            raise
        self._done.add(i)

    def take(self, entry: TensorEntry, dtype: torch.dtype) -> torch.Tensor:
        """The tensor as a view of the buffer, its segments decrypted and checked first."""
        self.ensure(entry.offset, entry.nbytes)
        return self.buffer[entry.offset : entry.offset + entry.nbytes].view(dtype).reshape(entry.shape)

    def readers(self, dtypes: dict[str, torch.dtype]) -> dict[str, Callable[[], torch.Tensor]]:
        return {t.name: partial(self.take, t, dtypes[t.dtype]) for t in self.manifest.tensors}

    def extents(self) -> dict[str, tuple[int, int]]:
        """Where each tensor will lie in the buffer (its address range), known before it is decrypted."""
        base = self.buffer.data_ptr()
        return {t.name: (base + t.offset, base + t.offset + t.nbytes) for t in self.manifest.tensors}

    def decrypted_ranges(self) -> Iterator[tuple[int, int]]:
        size = self.manifest.segment_size
        for i in sorted(self._done):
            yield i * size, i * size + self.manifest.segment_len(i)

    def close(self) -> None:
        """The build is over: no segment is decrypted any more (the segment key is dropped)."""
        with self._lock:
            self._algorithm = None

    def wipe(self) -> None:
        """Zero every decrypted byte not given back already; pages never decrypted are not touched
        (writing them would fault the whole reserved buffer in)."""
        self.close()
        with self._lock:
            self.release.wipe(within=list(self.decrypted_ranges()))
