"""Worker side: stream the payload, decrypt each segment straight into one preallocated buffer.

The tensors are views into that buffer, so there is exactly one plaintext copy and it is in
memory only. Any failure wipes the buffer before the error propagates: nothing partial is served.

Three stages overlap: a read-ahead thread fills the next ciphertext buffer (readinto releases the
GIL), the calling thread decrypts with update_into straight into the tensor buffer (cryptography
holds the GIL here, so it gets a thread of its own), and a hashing thread digests the plaintext
(blake3 releases the GIL). Peak memory is the model plus two ciphertext segments.
"""

from __future__ import annotations

import hmac
import json
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import torch
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from protocol.package.errors import PackageFormatError, PackageIntegrityError, WrongKeyError
from protocol.package.format import (
    TAG_BYTES,
    Manifest,
    ad_prefix,
    associated_data,
    key_check_value,
    new_hasher,
    nonce_for,
    segment_key,
)
from protocol.package.signing import read_manifest

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
    tensors: dict[str, torch.Tensor]
    buffer: torch.Tensor  # the single plaintext copy; the tensors are views into it

    def wipe(self) -> None:
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
) -> DecryptedModel:
    """Verify, decrypt and digest-check a package into memory; raises a PackageError on any doubt.

    `allocate(nbytes)` returns the uint8 CPU tensor that will hold the plaintext (default:
    torch.empty); it is zeroed if anything fails after allocation.
    """
    manifest, raw, signer = read_manifest(pkg_dir, required_signer=required_signer)
    if len(data_key) != 32 or not hmac.compare_digest(key_check_value(data_key, manifest.package_id),
                                                      manifest.key_check):
        raise WrongKeyError("data key does not match this package")
    payload = Path(pkg_dir) / "payload.bin"
    try:
        fh: BinaryIO = open(payload, "rb", buffering=0)  # noqa: SIM115 (closed below)
    except OSError as exc:
        raise PackageIntegrityError("payload missing") from exc
    with fh:
        actual = fh.seek(0, 2)
        fh.seek(0)
        if actual != manifest.payload_bytes:
            # Truncation or extension: refuse before allocating or decrypting anything.
            raise PackageIntegrityError(
                f"payload is {actual} bytes, the manifest requires {manifest.payload_bytes}")
        buffer = (allocate or _torch_allocate)(manifest.plaintext_bytes + _SLACK)
        try:
            decrypt_stream(fh, manifest, raw, data_key, buffer, progress)
            metadata = json.loads(bytes(buffer[: manifest.metadata_bytes].numpy()))
            tensors = {
                t.name: buffer[t.offset : t.offset + t.nbytes].view(TORCH_DTYPES[t.dtype]).reshape(t.shape)
                for t in manifest.tensors
            }
        except BaseException as exc:
            buffer.zero_()
            if isinstance(exc, ValueError) and not isinstance(exc, PackageIntegrityError):
                raise PackageFormatError(f"package metadata is not valid JSON: {exc}") from exc
            raise
    return DecryptedModel(manifest, signer, metadata, tensors, buffer)


def _read_exact(fh: BinaryIO, view: memoryview) -> int:
    got = 0
    while got < len(view):
        n = fh.readinto(view[got:])
        if not n:
            break
        got += n
    return got


def decrypt_stream(
    fh: BinaryIO,
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
    prefix = ad_prefix(manifest.package_id, manifest_bytes)
    algorithm = algorithms.AES(segment_key(data_key, manifest.package_id))
    out = memoryview(buffer.numpy())
    hasher = new_hasher(manifest.digest_alg)
    bufs = [bytearray(manifest.segment_size + TAG_BYTES) for _ in range(2)]
    last = manifest.num_segments - 1
    with ThreadPoolExecutor(1, "pkg-read") as reader, ThreadPoolExecutor(1, "pkg-hash") as hashing:
        try:
            def read(i: int) -> Future[int]:
                view = memoryview(bufs[i % 2])[: manifest.segment_len(i) + TAG_BYTES]
                return reader.submit(_read_exact, fh, view)

            pending = read(0)
            for i in range(manifest.num_segments):
                n = manifest.segment_len(i)
                if pending.result() != n + TAG_BYTES:
                    raise PackageIntegrityError(f"segment {i} is short")
                if i < last:
                    pending = read(i + 1)  # the other buffer: its segment is already decrypted
                ct = memoryview(bufs[i % 2])
                start = i * manifest.segment_size
                t0 = time.perf_counter()
                decryptor = Cipher(algorithm, modes.GCM(nonce_for(i, i == last), bytes(ct[n : n + TAG_BYTES]))
                                   ).decryptor()
                decryptor.authenticate_additional_data(associated_data(prefix, i, i == last))
                decryptor.update_into(ct[:n], out[start:])
                try:
                    decryptor.finalize()
                except InvalidTag as exc:
                    raise PackageIntegrityError(f"segment {i} failed authentication") from exc
                if timings is not None:
                    timings["decrypt_s"] = timings.get("decrypt_s", 0.0) + time.perf_counter() - t0
                hashing.submit(hasher.update, out[start : start + n])
                if progress:
                    progress(n)
        except BaseException:
            hashing.shutdown(wait=True, cancel_futures=True)
            raise
    if not hmac.compare_digest(hasher.hexdigest(), manifest.plaintext_digest.split(":", 1)[1]):
        raise PackageIntegrityError("plaintext digest differs from the signed manifest")
