"""The package payload's segment loop, one for both readers (reader.py into CPU memory,
device_reader.py through a CPU staging buffer into accelerator memory).

`open_payload` checks the key against the manifest and the payload's size before anything is
allocated; `decrypt_segments` reads ciphertext ahead in a thread (two segment buffers, readinto
releases the GIL), decrypts and authenticates each segment (header, index and "last" bound as
associated data) into the view the caller names, and yields it; `check_digest` compares the
plaintext digest with the signed manifest.
"""

from __future__ import annotations

import contextlib
import hmac
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from io import RawIOBase
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from protocol.package.errors import PackageIntegrityError, WrongKeyError
from protocol.package.format import (
    TAG_BYTES,
    Manifest,
    ad_prefix,
    associated_data,
    key_check_value,
    nonce_for,
    segment_key,
)
from protocol.package.signing import read_manifest


@contextlib.contextmanager
def open_payload(pkg_dir: Path, data_key: bytes, required_signer: str | None
                 ) -> Iterator[tuple[Manifest, bytes, str, RawIOBase]]:
    """(manifest, its signed bytes, signer, payload file): the key is the package's, the payload
    has exactly the size the manifest requires (truncation or extension refused before any
    allocation or decryption)."""
    manifest, raw, signer = read_manifest(pkg_dir, required_signer=required_signer)
    if len(data_key) != 32 or not hmac.compare_digest(key_check_value(data_key, manifest.package_id),
                                                      manifest.key_check):
        raise WrongKeyError("data key does not match this package")
    try:
        fh: RawIOBase = open(Path(pkg_dir) / "payload.bin", "rb", buffering=0)  # noqa: SIM115 (closed below)
    except OSError as exc:
        raise PackageIntegrityError("payload missing") from exc
    with fh:
        actual = fh.seek(0, 2)
        fh.seek(0)
        if actual != manifest.payload_bytes:
            raise PackageIntegrityError(f"payload is {actual} bytes, the manifest requires {manifest.payload_bytes}")
        yield manifest, raw, signer, fh


def read_exact(fh: RawIOBase, view: memoryview) -> int:
    got = 0
    while got < len(view):
        n = fh.readinto(view[got:])
        if not n:
            break
        got += n
    return got


def decrypt_segments(fh: RawIOBase, manifest: Manifest, manifest_bytes: bytes, data_key: bytes,
                     into: Callable[[int], memoryview], timings: dict[str, float] | None = None
                     ) -> Iterator[tuple[int, memoryview]]:
    """Yield (index, plaintext) per segment, decrypted into `into(index)` and authenticated.
    `timings["decrypt_s"]` accumulates the seconds in the cipher itself (the load benchmark
    compares it with `openssl speed`)."""
    prefix = ad_prefix(manifest.package_id, manifest_bytes)
    algorithm = algorithms.AES(segment_key(data_key, manifest.package_id))
    bufs = [bytearray(manifest.segment_size + TAG_BYTES) for _ in range(2)]
    last = manifest.num_segments - 1
    with ThreadPoolExecutor(1, "pkg-read") as reader:
        def read(i: int) -> Future[int]:
            return reader.submit(read_exact, fh, memoryview(bufs[i % 2])[: manifest.segment_len(i) + TAG_BYTES])

        pending = read(0)
        for i in range(manifest.num_segments):
            n = manifest.segment_len(i)
            if pending.result() != n + TAG_BYTES:
                raise PackageIntegrityError(f"segment {i} is short")
            if i < last:
                pending = read(i + 1)  # the other buffer: its segment is already decrypted
            ct, out = memoryview(bufs[i % 2]), into(i)
            t0 = time.perf_counter()
            decrypt_segment(algorithm, prefix, i, i == last, ct[: n + TAG_BYTES], out)
            if timings is not None:
                timings["decrypt_s"] = timings.get("decrypt_s", 0.0) + time.perf_counter() - t0
            yield i, out[:n]


def decrypt_segment(algorithm: algorithms.AES, prefix: bytes, index: int, final: bool,
                    ciphertext: memoryview, out: memoryview) -> None:
    """Decrypt one segment (its ciphertext, then its 16-byte tag) into `out` and authenticate it:
    its position and the final flag are in the nonce and the AD. On a bad tag `out` holds
    unauthenticated plaintext: the caller zeroes it (every caller wipes its buffer on error)."""
    n = len(ciphertext) - TAG_BYTES
    decryptor = Cipher(algorithm, modes.GCM(nonce_for(index, final), bytes(ciphertext[n:]))).decryptor()
    decryptor.authenticate_additional_data(associated_data(prefix, index, final))
    decryptor.update_into(ciphertext[:n], out)
    try:
        decryptor.finalize()
    except InvalidTag as exc:
        raise PackageIntegrityError(f"segment {index} failed authentication") from exc


def check_digest(hasher: Any, manifest: Manifest) -> None:
    if not hmac.compare_digest(hasher.hexdigest(), manifest.plaintext_digest.split(":", 1)[1]):
        raise PackageIntegrityError("plaintext digest differs from the signed manifest")
