"""Decrypt a package straight into accelerator memory, one segment of plaintext on the CPU at a time.

For a GPU worker the weights' one plaintext copy lives in GPU memory (inside the CVM's protected
region when the GPU is in CC mode). Each segment is decrypted into one CPU staging buffer,
digested, copied to its place in the device buffer, and the staging buffer is zeroed before the
next segment, so at most one segment of plaintext sits in CPU memory, never the model.
Ciphertext is read ahead in a thread (two segment buffers), as in reader.decrypt_stream.
"""

from __future__ import annotations

from collections.abc import Callable
from io import RawIOBase
from pathlib import Path

import torch

from enclave_worker.package.reader import DecryptedModel, load_into
from enclave_worker.package.segments import check_digest, decrypt_segments, open_payload
from protocol.package.format import Manifest, new_hasher

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
    with open_payload(pkg_dir, data_key, required_signer) as (manifest, raw, signer, fh):
        # Pinned staging makes the host-to-device copy a DMA; on CUDA it must stay pinned.
        pin = torch.device(device).type == "cuda"
        staging = torch.zeros(manifest.segment_size + _SLACK, dtype=torch.uint8, pin_memory=pin)
        buffer = torch.zeros(manifest.plaintext_bytes + _SLACK, dtype=torch.uint8, device=device)
        try:
            return load_into(buffer, manifest, signer,
                             lambda: _stream(fh, manifest, raw, data_key, buffer, staging, on_segment))
        finally:
            staging.zero_()


def _stream(fh: RawIOBase, manifest: Manifest, manifest_bytes: bytes, data_key: bytes, buffer: torch.Tensor,
            staging: torch.Tensor, on_segment: SegmentHook | None) -> None:
    out = staging.numpy().data
    hasher = new_hasher(manifest.digest_alg)
    for i, plaintext in decrypt_segments(fh, manifest, manifest_bytes, data_key, lambda i: out):
        n = len(plaintext)
        hasher.update(plaintext)
        start = i * manifest.segment_size
        # Synchronous copy: the staging buffer is reused (and zeroed) right after.
        buffer[start : start + n].copy_(staging[:n], non_blocking=False)
        if on_segment is not None:
            on_segment(i, staging)
        staging[:n].zero_()
    check_digest(hasher, manifest)
