"""The writer's second pass: encrypt the plaintext stream segment by segment into payload.bin.

Segments are independent under the format (each has its own nonce, AD and tag), so `threads`
workers encrypt consecutive segments at once while the calling thread writes the finished ones in
order. `cryptography`'s `update_into` releases the GIL for the AES-GCM work (OpenSSL), and so does
the file write, so on N cores N segments are in the cipher at once (measured in docs/benchmarks.md,
"Package encryption"). Each worker reads its segment's pieces where they lie (a mapped shard window,
a tensor) into its own reused ciphertext buffer: no plaintext staging copy, no per-segment
allocation. Memory: (threads + 1) ciphertext buffers plus the windows being read, whatever the
model size.

The payload is as large as the model, and a large model's shards plus its payload outgrow the page
cache: every `_FLUSH_EVERY` bytes a background thread flushes what was written (fdatasync) and
drops it from the cache (POSIX_FADV_DONTNEED). Dirty memory stays bounded, the final fsync is short,
and the cache keeps the shards, which the digest pass has just read and this pass reads again.
"""

from __future__ import annotations

import os
import stat
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import BinaryIO

from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from protocol.package.format import TAG_BYTES, associated_data, nonce_for

Pieces = Callable[[int, int], Iterator[memoryview]]  # (start, end) -> the stream's bytes as views
_MAX_THREADS = 4  # past the cores a tenant's laptop has, more threads only add buffers
_FLUSH_EVERY = 256 << 20


def _flush_and_drop(fd: int, upto: int) -> None:
    os.fdatasync(fd)
    if hasattr(os, "posix_fadvise"):  # Linux; elsewhere the cache keeps the written pages
        os.posix_fadvise(fd, 0, upto, os.POSIX_FADV_DONTNEED)


def default_threads() -> int:
    """One encrypting thread per core this process may run on, at most _MAX_THREADS."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return max(1, min(_MAX_THREADS, cores))


def encrypt_segments(fh: BinaryIO, pieces: Pieces, *, key: algorithms.AES, ad_prefix: bytes, total: int,
                     segment_size: int, num_segments: int, threads: int,
                     progress: Callable[[int], None] | None = None) -> None:
    """Write every segment's ciphertext and tag to `fh`, in order."""
    if threads < 1:
        raise ValueError(f"threads must be at least 1, not {threads}")
    last = num_segments - 1

    def encrypt(i: int, out: memoryview) -> int:
        encryptor = Cipher(key, modes.GCM(nonce_for(i, i == last))).encryptor()
        encryptor.authenticate_additional_data(associated_data(ad_prefix, i, i == last))
        n = 0
        for view in pieces(i * segment_size, min((i + 1) * segment_size, total)):
            n += encryptor.update_into(view, out[n:])
        encryptor.finalize()
        out[n : n + TAG_BYTES] = encryptor.tag
        return n

    # One buffer more than workers: the oldest is being written while every worker encrypts.
    # update_into wants a block's slack past the segment.
    free = [memoryview(bytearray(segment_size + TAG_BYTES + 16)) for _ in range(min(threads + 1, num_segments))]
    pending: deque[tuple[Future[int], memoryview]] = deque()
    flushed: Future[None] | None = None
    written = flushed_upto = 0
    regular = stat.S_ISREG(os.fstat(fh.fileno()).st_mode)  # not a pipe, a device, /dev/null
    with ThreadPoolExecutor(threads, "pkg-encrypt") as pool, ThreadPoolExecutor(1, "pkg-flush") as flusher:
        try:
            submitted = 0
            while submitted < num_segments or pending:
                while free and submitted < num_segments:
                    buf = free.pop()
                    pending.append((pool.submit(encrypt, submitted, buf), buf))
                    submitted += 1
                future, buf = pending.popleft()
                n = future.result()
                fh.write(buf[: n + TAG_BYTES])
                free.append(buf)
                written += n + TAG_BYTES
                if regular and written - flushed_upto >= _FLUSH_EVERY and (flushed is None or flushed.done()):
                    if flushed is not None:
                        flushed.result()  # a failed flush (disk full, I/O error) stops the write
                    fh.flush()
                    flushed, flushed_upto = flusher.submit(_flush_and_drop, fh.fileno(), written), written
                if progress:
                    progress(n)
        except BaseException:
            for future, _ in pending:
                future.cancel()
            raise
        if flushed is not None:
            flushed.result()
