"""Worker side: stream the payload, decrypt each segment straight into one preallocated buffer.

The tensors are views into that buffer, so there is exactly one plaintext copy and it is in
memory only. Any failure wipes the buffer before the error propagates: nothing partial is served.

Three stages overlap: a read-ahead thread fills the next ciphertext buffer (readinto releases the
GIL), the calling thread decrypts with update_into straight into the tensor buffer, and a hashing
thread digests the plaintext (blake3 releases the GIL). cryptography 50 releases the GIL in
update_into too (2.25 GB/s in one thread, 3.85 in two, dev VM), but a second decrypting thread
gained only ~0.05 s of 0.4 s on 2 cores beside the hashing (docs/benchmarks.md, "vLLM engine").
Peak memory is the model plus two ciphertext segments.
"""

from __future__ import annotations

import json
from collections.abc import Callable, MutableMapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from io import RawIOBase
from pathlib import Path
from typing import Any

import torch

from enclave_worker.engine.lazy_tensors import LazyTensors
from enclave_worker.package.page_release import PageRelease
from enclave_worker.package.segments import check_digest, decrypt_segments, open_payload
from enclave_worker.package.stream import PackageStream, verify
from protocol.package.errors import PackageFormatError, PackageIntegrityError
from protocol.package.format import Manifest, new_hasher

TORCH_DTYPES = {
    "float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
    "int8": torch.int8, "uint8": torch.uint8, "int32": torch.int32, "int64": torch.int64,
}
_SLACK = 32  # update_into may need up to a block of headroom past the segment

Allocator = Callable[[int], torch.Tensor]


@dataclass(frozen=True)
class DecryptedModel:
    manifest: Manifest
    signer: str
    metadata: dict[str, Any]
    # a dict of views; streamed (decrypt_package(stream=True)): a LazyTensors whose tensors are
    # decrypted when taken, each a view too
    tensors: MutableMapping[str, torch.Tensor]
    buffer: torch.Tensor  # the single plaintext copy; the tensors are views into it
    # CPU buffer: the engine's build gives back the pages of the tensors it converted (page_release.py)
    release: PageRelease | None = None
    stream: PackageStream | None = None  # a streamed load: the segments decrypted so far (stream.py)

    def end_stream(self) -> None:
        """The build is done: a streamed package decrypts nothing more (its segment key is dropped)."""
        if self.stream is not None:
            self.stream.close()

    def wipe(self) -> None:
        if self.stream is not None:
            self.stream.wipe()  # only what was decrypted: the rest of the buffer was never touched
        elif self.release is not None:
            self.release.wipe()  # the released pages are zeros already; touching them would fault them in
        else:
            self.buffer.zero_()


def _torch_allocate(nbytes: int) -> torch.Tensor:
    # Zeroed by torch's parallel fill: each fresh page's first touch (a page fault, costly in a
    # VM) then happens on every core at once instead of one by one inside the decrypt loop; the
    # load is ~12% faster for it (docs/package-format.md).
    return torch.zeros(nbytes, dtype=torch.uint8)


def decrypt_package(
    pkg_dir: Path,
    data_key: bytes,
    *,
    required_signer: str | None = None,
    progress: Callable[[int], None] | None = None,
    allocate: Allocator | None = None,
    stream: bool = False,
) -> DecryptedModel:
    """Verify, decrypt and digest-check a package into memory; raises a PackageError on any doubt.

    `allocate(nbytes)` returns the uint8 CPU tensor that will hold the plaintext (default:
    torch.zeros); it is zeroed if anything fails after allocation. `stream`: the whole payload is
    authenticated first, then each tensor is decrypted into its place when the build takes it
    (stream.py; `allocate` is not used: the buffer is reserved untouched).
    """
    with open_payload(pkg_dir, data_key, required_signer) as (manifest, raw, signer, fh):
        if stream:
            return _streamed(pkg_dir, manifest, raw, signer, data_key, verify(fh, manifest, raw, data_key))
        buffer = (allocate or _torch_allocate)(manifest.plaintext_bytes + _SLACK)
        return load_into(buffer, manifest, signer,
                         lambda: decrypt_stream(fh, manifest, raw, data_key, buffer, progress))


def load_into(buffer: torch.Tensor, manifest: Manifest, signer: str, fill: Callable[[], None]) -> DecryptedModel:
    """Run `fill` (which decrypts the package into `buffer`), then read the metadata and make the
    tensors views into the buffer; on any failure the buffer is zeroed before the error leaves."""
    try:
        fill()
        metadata = json.loads(bytes(buffer[: manifest.metadata_bytes].cpu().numpy()))
        tensors = {
            t.name: buffer[t.offset : t.offset + t.nbytes].view(TORCH_DTYPES[t.dtype]).reshape(t.shape)
            for t in manifest.tensors
        }
    except BaseException as exc:
        buffer.zero_()
        if isinstance(exc, ValueError) and not isinstance(exc, PackageIntegrityError):
            raise PackageFormatError(f"package metadata is not valid JSON: {exc}") from exc
        raise
    release = PageRelease(buffer) if buffer.device.type == "cpu" and buffer.is_contiguous() else None
    return DecryptedModel(manifest, signer, metadata, tensors, buffer, release)


def decrypt_stream(
    fh: RawIOBase,
    manifest: Manifest,
    manifest_bytes: bytes,
    data_key: bytes,
    buffer: torch.Tensor,
    progress: Callable[[int], None] | None = None,
    timings: dict[str, float] | None = None,
) -> None:
    """Decrypt every segment from `fh` into `buffer` and check the signed plaintext digest.

    `timings`, if given, accumulates the seconds spent in the cipher itself under "decrypt_s"
    (the benchmark compares that with `openssl speed`).
    """
    out = buffer.numpy().data
    hasher = new_hasher(manifest.digest_alg)
    with ThreadPoolExecutor(1, "pkg-hash") as hashing:
        try:
            segments = decrypt_segments(fh, manifest, manifest_bytes, data_key,
                                        lambda i: out[i * manifest.segment_size:], timings)
            for _, plaintext in segments:
                hashing.submit(hasher.update, plaintext)
                if progress:
                    progress(len(plaintext))
        except BaseException:
            hashing.shutdown(wait=True, cancel_futures=True)
            raise
    check_digest(hasher, manifest)


def _streamed(pkg_dir: Path, manifest: Manifest, raw: bytes, signer: str, data_key: bytes,
              digests: list[bytes]) -> DecryptedModel:
    # torch.empty: a large block is a fresh mapping, so no page of it is resident until decrypted into
    buffer = torch.empty(manifest.plaintext_bytes + _SLACK, dtype=torch.uint8)
    source = PackageStream(pkg_dir, manifest, raw, data_key, digests, buffer)
    try:
        source.ensure(0, manifest.metadata_bytes)
        metadata = json.loads(bytes(buffer[: manifest.metadata_bytes].numpy()))
    except BaseException as exc:
        source.wipe()
        if isinstance(exc, ValueError) and not isinstance(exc, PackageIntegrityError):
            raise PackageFormatError(f"package metadata is not valid JSON: {exc}") from exc
        raise
    tensors = LazyTensors(source.readers(TORCH_DTYPES), source.extents())
    return DecryptedModel(manifest, signer, metadata, tensors, buffer, source.release, source)
