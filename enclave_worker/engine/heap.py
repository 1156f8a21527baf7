"""Giving freed heap memory back to the OS while a model is built.

glibc's malloc keeps freed chunks resident: a heap shrinks only from its top, and a chunk freed on
one thread goes back to the arena of the thread that allocated it. The checkpoint's tensors are read
on one thread and consumed (converted, repacked, dropped) on the compute thread (compute_thread.py),
so without a trim every source freed during the build stayed in RSS until the build ended: the
load's peak was the weights as held plus most of the checkpoint again. ``malloc_trim(0)`` returns
every whole free page of every arena (madvise), so trimmed after each layer the peak is the weights
plus about one layer's transients.
"""

from __future__ import annotations

import contextlib
import ctypes


def trim_heap() -> None:
    """Return freed heap pages of every malloc arena to the OS (glibc malloc_trim); best effort,
    a no-op where there is no glibc."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)
