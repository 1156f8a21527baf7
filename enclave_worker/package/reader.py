"""Worker side: stream the payload, decrypt each segment straight into one preallocated buffer.

The tensors are views into that buffer, so there is exactly one plaintext copy and it is in
memory only. Any failure wipes the buffer before the error propagates: nothing partial is served.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from enclave_worker.package.errors import (
    PackageFormatError,
    PackageIntegrityError,
    PackageSignatureError,
    WrongKeyError,
)
from enclave_worker.package.format import (
    TAG_BYTES,
    Manifest,
    associated_data,
    key_check_value,
    nonce_for,
    segment_key,
)
from enclave_worker.package.signing import verify_manifest_signature

_TORCH_DTYPES = {
    "float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
    "int8": torch.int8, "uint8": torch.uint8, "int32": torch.int32, "int64": torch.int64,
}
_SLACK = 32  # update_into may need up to a block of headroom past the segment


@dataclass(frozen=True)
class DecryptedModel:
    manifest: Manifest
    signer: str
    metadata: dict[str, Any]
    tensors: dict[str, torch.Tensor]
    buffer: torch.Tensor  # the single plaintext copy; the tensors are views into it

    def wipe(self) -> None:
        self.buffer.zero_()


def read_manifest(pkg_dir: Path, *, required_signer: str | None = None) -> tuple[Manifest, bytes, str]:
    try:
        raw = (pkg_dir / "manifest.json").read_bytes()
    except OSError as exc:
        raise PackageFormatError(f"no manifest in {pkg_dir}") from exc
    manifest = Manifest.from_bytes(raw)
    signer = verify_manifest_signature(pkg_dir, raw, manifest.signer)
    if required_signer is not None and signer != required_signer:
        raise PackageSignatureError("package signer is not the required signer")
    return manifest, raw, signer


def decrypt_package(
    pkg_dir: Path,
    data_key: bytes,
    *,
    required_signer: str | None = None,
    progress: Callable[[int], None] | None = None,
) -> DecryptedModel:
    manifest, raw, signer = read_manifest(pkg_dir, required_signer=required_signer)
    if not hmac.compare_digest(key_check_value(data_key, manifest.package_id), manifest.key_check):
        raise WrongKeyError("data key does not match this package")
    buffer = torch.empty(manifest.plaintext_bytes + _SLACK, dtype=torch.uint8)
    try:
        _decrypt_into(pkg_dir / "payload.bin", manifest, raw, data_key, buffer, progress)
        metadata = json.loads(bytes(buffer[: manifest.metadata_bytes].numpy()))
        tensors = {
            t.name: buffer[t.offset : t.offset + t.nbytes].view(_TORCH_DTYPES[t.dtype]).reshape(t.shape)
            for t in manifest.tensors
        }
    except BaseException:
        buffer.zero_()
        raise
    return DecryptedModel(manifest, signer, metadata, tensors, buffer)


def _decrypt_into(
    payload: Path,
    manifest: Manifest,
    manifest_bytes: bytes,
    data_key: bytes,
    buffer: torch.Tensor,
    progress: Callable[[int], None] | None,
) -> None:
    manifest_digest = hashlib.sha256(manifest_bytes).digest()
    key = segment_key(data_key, manifest.package_id)
    out = memoryview(buffer.numpy())
    digest = hashlib.sha256()
    size = manifest.segment_size
    expected_len = sum(
        min(size, manifest.plaintext_bytes - i * size) + TAG_BYTES for i in range(manifest.num_segments)
    )
    try:
        fh = open(payload, "rb")
    except OSError as exc:
        raise PackageIntegrityError("payload missing") from exc
    with fh:
        actual_len = fh.seek(0, 2)
        fh.seek(0)
        if actual_len != expected_len:
            # Truncation or extension: refuse before decrypting anything.
            raise PackageIntegrityError(f"payload is {actual_len} bytes, the manifest requires {expected_len}")
        ct = bytearray(size + TAG_BYTES)
        for i in range(manifest.num_segments):
            final = i == manifest.num_segments - 1
            start = i * size
            n = min(size, manifest.plaintext_bytes - start)
            view = memoryview(ct)[: n + TAG_BYTES]
            if fh.readinto(view) != n + TAG_BYTES:
                raise PackageIntegrityError(f"segment {i} is short")
            decryptor = Cipher(algorithms.AES(key), modes.GCM(nonce_for(i, final), bytes(view[n:]))).decryptor()
            decryptor.authenticate_additional_data(associated_data(manifest_digest, i, final))
            decryptor.update_into(view[:n], out[start:])
            try:
                decryptor.finalize()
            except InvalidTag as exc:
                raise PackageIntegrityError(f"segment {i} failed authentication") from exc
            digest.update(out[start : start + n])
            if progress:
                progress(n)
    if not hmac.compare_digest(digest.hexdigest(), manifest.plaintext_sha256):
        raise PackageIntegrityError("plaintext digest differs from the signed manifest")
