"""Give the decrypted buffer's pages back as the engine consumes the tensors in it.

A bf16 package served in float32 (or any conversion: another dtype, a quantized layout) makes the
engine's weights a second copy of the buffer. Held to the end of the build, the buffer would put
the load's peak at the package's size on top of the weights (3x the bf16 bytes for a bf16 -> fp32
load). The builder (models/weights.py) tells a `PageRelease` each tensor it consumed that no built
layer holds; the pages wholly inside that tensor are zeroed (the plaintext is wiped at once, not at
the end) and handed back to the kernel with madvise(MADV_DONTNEED), so the buffer shrinks layer by
layer while the weights grow. Pages at a tensor's edges that it shares with a neighbour stay.

`wipe` zeroes what was not released; it does not touch the released pages (zeroing them again
would fault them back in: the buffer's whole size, at the moment the KV pool is allocated).
"""

from __future__ import annotations

import ctypes
import mmap
import threading
from collections.abc import Callable, Sequence

import torch

_PAGE = mmap.PAGESIZE


def _libc_madvise() -> Callable[[int, int, int], int] | None:
    try:
        fn = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):  # not a glibc/musl process: the pages are zeroed, not returned
        return None
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


def tensor_extent(tensor: torch.Tensor) -> tuple[int, int]:
    """[first byte, past last byte) of the memory a (possibly strided) tensor reads."""
    start = tensor.data_ptr()
    if tensor.numel() == 0:
        return start, start
    span = 1 + sum((size - 1) * stride for size, stride in zip(tensor.shape, tensor.stride(), strict=True))
    return start, start + span * tensor.element_size()


class PageRelease:
    """Releases pages of one CPU uint8 buffer; anything outside it is left alone."""

    def __init__(self, buffer: torch.Tensor) -> None:
        if buffer.device.type != "cpu" or buffer.dtype != torch.uint8 or not buffer.is_contiguous():
            raise ValueError("PageRelease takes a contiguous CPU uint8 buffer")
        self._buffer = buffer
        self._base = buffer.data_ptr()
        self._end = self._base + buffer.numel()
        self._released: list[tuple[int, int]] = []  # page-aligned, disjoint
        self._lock = threading.Lock()
        self._madvise = _libc_madvise()

    @property
    def released_bytes(self) -> int:
        with self._lock:
            return sum(hi - lo for lo, hi in self._released)

    def __call__(self, tensor: torch.Tensor) -> None:
        """Zero and give back the whole pages of the buffer that `tensor` covers. The caller vouches
        that nothing still reads them (models/weights.py: consumed, and held by no built layer)."""
        if tensor.device.type != "cpu" or tensor.is_mkldnn:
            return
        start, end = tensor_extent(tensor)
        lo = -(-max(start, self._base) // _PAGE) * _PAGE
        hi = min(end, self._end) // _PAGE * _PAGE
        if lo >= hi:
            return
        with self._lock:
            if any(a < hi and lo < b for a, b in self._released):
                return  # already given back (a tensor consumed twice under two names)
            ctypes.memset(lo, 0, hi - lo)  # wiped whether or not the kernel takes the pages back
            if self._madvise is not None:
                self._madvise(lo, hi - lo, mmap.MADV_DONTNEED)  # private anonymous: reads as zeros after
            self._released.append((lo, hi))

    def wipe(self, within: Sequence[tuple[int, int]] | None = None) -> None:
        """Zero every byte of the buffer that was not released (the released ones already are);
        `within`: only those [start, end) byte ranges of the buffer (a streamed load's decrypted
        segments: the pages it never decrypted into were never touched, and stay so)."""
        spans = (
            [(self._base, self._end)]
            if within is None
            else [(self._base + max(lo, 0), self._base + min(hi, self._end - self._base)) for lo, hi in within]
        )
        with self._lock:
            released = sorted(self._released)
            for start, end in spans:
                cursor = start
                for lo, hi in released:
                    if hi <= cursor or lo >= end:
                        continue
                    if lo > cursor:
                        ctypes.memset(cursor, 0, lo - cursor)
                    cursor = max(cursor, hi)
                if end > cursor:
                    ctypes.memset(cursor, 0, end - cursor)
