"""Tenant side: encrypt a model's tensors into a package (runs on the tenant's own machine)."""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from protocol.package.errors import PackageFormatError
from protocol.package.format import (
    DEFAULT_DIGEST_ALG,
    DEFAULT_SEGMENT_SIZE,
    Manifest,
    TensorEntry,
    ad_prefix,
    aligned,
    associated_data,
    key_check_value,
    metadata_to_bytes,
    new_hasher,
    nonce_for,
    segment_key,
)
from protocol.package.signing import SIGNATURE_FILES, SigningKey, sign_manifest, signer_identity

_DTYPE_NAMES = {
    torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16",
    torch.int8: "int8", torch.uint8: "uint8", torch.int32: "int32", torch.int64: "int64",
}


def _tensor_bytes(t: torch.Tensor) -> memoryview:
    flat = t.detach().contiguous().reshape(-1)
    return flat.view(torch.uint8).numpy().data


def _plaintext_chunks(meta: bytes, tensors: Sequence[tuple[str, torch.Tensor]],
                      entries: Sequence[TensorEntry]) -> Iterator[memoryview | bytes]:
    yield meta
    cursor = len(meta)
    for (_, tensor), entry in zip(tensors, entries, strict=True):
        if entry.offset > cursor:
            yield bytes(entry.offset - cursor)
        yield _tensor_bytes(tensor)
        cursor = entry.offset + entry.nbytes


def _segments(chunks: Iterator[memoryview | bytes], size: int) -> Iterator[memoryview]:
    """Re-cut the plaintext stream into segments; one reused staging buffer, no per-segment copies."""
    pending = bytearray(size)
    filled = 0
    for chunk in chunks:
        view = memoryview(chunk)
        while len(view):
            take = min(size - filled, len(view))
            pending[filled : filled + take] = view[:take]
            filled += take
            view = view[take:]
            if filled == size:
                yield memoryview(pending)
                filled = 0
    if filled:
        yield memoryview(pending)[:filled]


# Parts the engine fuses into one matrix (models/llama.py), in fusion order.
_FUSED_GROUPS = (("self_attn.", ("q_proj", "k_proj", "v_proj")), ("mlp.", ("gate_proj", "up_proj")))


def fusion_adjacent_order(tensors: Sequence[tuple[str, torch.Tensor]]) -> list[tuple[str, torch.Tensor]]:
    """The given order, except that parts the engine fuses (q/k/v, gate/up; weights and biases) sit
    next to each other in fusion order, at the first part's place.

    The payload layout is free (every offset is in the signed manifest); laid out this way, the
    worker fuses them as a view of the decrypted buffer instead of a second copy.
    """
    by_name = dict(tensors)
    placed: set[str] = set()
    out: list[tuple[str, torch.Tensor]] = []
    for name, _ in tensors:
        if name in placed:
            continue
        group = [name]
        for scope, parts in _FUSED_GROUPS:
            for part in parts:
                marker = f"{scope}{part}."
                if marker in name:
                    head, tail = name.split(marker, 1)
                    group = [f"{head}{scope}{p}.{tail}" for p in parts if f"{head}{scope}{p}.{tail}" in by_name]
        for member in group:
            if member not in placed:
                placed.add(member)
                out.append((member, by_name[member]))
    return out


def write_package(
    out_dir: Path,
    *,
    metadata: dict[str, Any],
    tensors: Sequence[tuple[str, torch.Tensor]],
    data_key: bytes,
    key_id: str,
    tenant: str,
    model: str,
    version: str,
    signing_key: SigningKey,
    segment_size: int = DEFAULT_SEGMENT_SIZE,
    progress: Callable[[int], None] | None = None,
    digest_alg: str = DEFAULT_DIGEST_ALG,
) -> Manifest:
    """Write manifest.json, its signature and payload.bin. Plaintext never touches the disk.

    `signing_key`: an Ed25519 private key, or a ModelSigningKey (OpenSSF model-signing, EC key).
    """
    meta = metadata_to_bytes(metadata)
    tensors = fusion_adjacent_order(tensors)
    entries: list[TensorEntry] = []
    cursor = len(meta)
    for name, tensor in tensors:
        offset = aligned(cursor)
        nbytes = tensor.numel() * tensor.element_size()
        if tensor.dtype not in _DTYPE_NAMES:
            raise PackageFormatError(f"tensor {name}: dtype {tensor.dtype} is not supported by the format")
        entries.append(TensorEntry(name, _DTYPE_NAMES[tensor.dtype], tuple(tensor.shape), offset, nbytes))
        cursor = offset + nbytes
    # First pass: the digest goes into the manifest, and the manifest into every segment's AD.
    digest = new_hasher(digest_alg)
    for chunk in _plaintext_chunks(meta, tensors, entries):
        digest.update(chunk)
    package_id = secrets.token_hex(16)
    manifest = Manifest(
        package_id=package_id, tenant=tenant, model=model, version=version, key_id=key_id,
        segment_size=segment_size, num_segments=max(1, -(-cursor // segment_size)),
        plaintext_bytes=cursor, plaintext_digest=f"{digest_alg}:{digest.hexdigest()}",
        metadata_bytes=len(meta),
        key_check=key_check_value(data_key, package_id), signer=signer_identity(signing_key.public_key()),
        tensors=tuple(entries),
    )
    manifest_bytes = manifest.to_bytes()
    prefix = ad_prefix(package_id, manifest_bytes)
    aead = AESGCM(segment_key(data_key, package_id))
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = out_dir / "payload.bin.partial"
    with open(tmp, "wb") as fh:
        for i, segment in enumerate(_segments(_plaintext_chunks(meta, tensors, entries), segment_size)):
            final = i == manifest.num_segments - 1
            fh.write(aead.encrypt(nonce_for(i, final), segment, associated_data(prefix, i, final)))
            if progress:
                progress(len(segment))
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, out_dir / "payload.bin")
    (out_dir / "manifest.json").write_bytes(manifest_bytes)
    for stale in SIGNATURE_FILES:  # a rewritten package must not keep the other method's signature
        (out_dir / stale).unlink(missing_ok=True)
    sign_manifest(out_dir, manifest_bytes, signing_key)
    return manifest
