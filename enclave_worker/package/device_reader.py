"""Decrypt a package straight into accelerator memory, one segment of plaintext on the CPU at a time.

For a GPU worker the weights' one plaintext copy lives in GPU memory (inside the CVM's protected
region when the GPU is in CC mode). Each segment is decrypted into one CPU staging buffer,
digested, copied to its place in the device buffer, and the staging buffer is zeroed before the
next segment, so at most one segment of plaintext sits in CPU memory, never the model.
Ciphertext is read ahead in a thread (two segment buffers), as in reader.decrypt_stream.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import BinaryIO

import torch
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from enclave_worker.package.reader import TORCH_DTYPES, DecryptedModel, _read_exact
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

_SLACK = 32
# Called after each segment with the staging buffer, before it is zeroed (tests check that it
# never holds more than the current segment).
SegmentHook = Callable[[int, torch.Tensor], None]


def decrypt_package_to_device(
    pkg_dir: Path,
    data_key: bytes,
    device: str | torch.device,
    *,
    required_signer: str | None = None,
    on_segment: SegmentHook | None = None,
) -> DecryptedModel:
    """Like reader.decrypt_package, with the plaintext buffer on `device` (e.g. "cuda")."""
    manifest, raw, signer = read_manifest(pkg_dir, required_signer=required_signer)
    if len(data_key) != 32 or not hmac.compare_digest(key_check_value(data_key, manifest.package_id),
                                                      manifest.key_check):
        raise WrongKeyError("data key does not match this package")
    payload = Path(pkg_dir) / "payload.bin"
    try:
        fh: BinaryIO = open(payload, "rb", buffering=0)  # noqa: SIM115 (closed below)
    except OSError as exc:
        raise PackageIntegrityError("payload missing") from exc
    # Pinned staging makes the host-to-device copy a DMA; on CUDA it must stay pinned.
    pin = torch.device(device).type == "cuda"
    staging = torch.zeros(manifest.segment_size + _SLACK, dtype=torch.uint8, pin_memory=pin)
    with fh:
        if fh.seek(0, 2) != manifest.payload_bytes:
            raise PackageIntegrityError(f"payload size differs from the {manifest.payload_bytes} bytes required")
        fh.seek(0)
        buffer = torch.zeros(manifest.plaintext_bytes + _SLACK, dtype=torch.uint8, device=device)
        try:
            _stream(fh, manifest, raw, data_key, buffer, staging, on_segment)
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
        finally:
            staging.zero_()
    return DecryptedModel(manifest, signer, metadata, tensors, buffer)


def _stream(fh: BinaryIO, manifest: Manifest, manifest_bytes: bytes, data_key: bytes, buffer: torch.Tensor,
            staging: torch.Tensor, on_segment: SegmentHook | None) -> None:
    prefix = ad_prefix(manifest.package_id, manifest_bytes)
    algorithm = algorithms.AES(segment_key(data_key, manifest.package_id))
    out = memoryview(staging.numpy())
    hasher = new_hasher(manifest.digest_alg)
    bufs = [bytearray(manifest.segment_size + TAG_BYTES) for _ in range(2)]
    last = manifest.num_segments - 1
    with ThreadPoolExecutor(1, "pkg-read") as reader:
        def read(i: int):  # type: ignore[no-untyped-def]
            return reader.submit(_read_exact, fh, memoryview(bufs[i % 2])[: manifest.segment_len(i) + TAG_BYTES])

        pending = read(0)
        for i in range(manifest.num_segments):
            n = manifest.segment_len(i)
            if pending.result() != n + TAG_BYTES:
                raise PackageIntegrityError(f"segment {i} is short")
            if i < last:
                pending = read(i + 1)
            ct = memoryview(bufs[i % 2])
            decryptor = Cipher(algorithm, modes.GCM(nonce_for(i, i == last), bytes(ct[n : n + TAG_BYTES]))).decryptor()
            decryptor.authenticate_additional_data(associated_data(prefix, i, i == last))
            decryptor.update_into(ct[:n], out)
            try:
                decryptor.finalize()
            except InvalidTag as exc:
                raise PackageIntegrityError(f"segment {i} failed authentication") from exc
            hasher.update(out[:n])
            start = i * manifest.segment_size
            # Synchronous copy: the staging buffer is reused (and zeroed) right after.
            buffer[start : start + n].copy_(staging[:n], non_blocking=False)
            if on_segment is not None:
                on_segment(i, staging)
            staging[:n].zero_()
    if not hmac.compare_digest(hasher.hexdigest(), manifest.plaintext_digest.split(":", 1)[1]):
        raise PackageIntegrityError("plaintext digest differs from the signed manifest")
