"""Tenant side: encrypt a model's tensors into a package (runs on the tenant's own machine)."""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import torch
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from enclave_worker.package.sources import InMemoryTensor, TensorSource
from protocol.package.errors import PackageFormatError
from protocol.package.format import (
    DEFAULT_DIGEST_ALG,
    DEFAULT_SEGMENT_SIZE,
    TAG_BYTES,
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

T = TypeVar("T")
_DTYPE_NAMES = {
    torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16",
    torch.int8: "int8", torch.uint8: "uint8", torch.int32: "int32", torch.int64: "int64",
}


_ZEROS = bytes(64)  # the padding before a 64-byte aligned tensor is shorter than this
_SCRATCH = 16 << 20  # the digest pass reads a file-backed tensor in pieces of this size


def _digest(meta: bytes, sources: Sequence[TensorSource], entries: Sequence[TensorEntry], alg: str) -> str:
    """First pass: the plaintext digest, which the manifest signs and every segment's AD binds."""
    hasher = new_hasher(alg)
    hasher.update(meta)
    cursor = len(meta)
    scratch = memoryview(bytearray(_SCRATCH))
    for source, entry in zip(sources, entries, strict=True):
        hasher.update(_ZEROS[: entry.offset - cursor])
        for view in source.chunks(scratch):
            hasher.update(view)
        cursor = entry.offset + entry.nbytes
    return f"{alg}:{hasher.hexdigest()}"


def _segments(meta: bytes, sources: Sequence[TensorSource], entries: Sequence[TensorEntry], total: int,
              size: int) -> Iterator[memoryview]:
    """Second pass: the plaintext stream cut into segments, each tensor's bytes read straight into
    one reused segment buffer (no per-segment allocation, no whole tensor in memory)."""
    buffer = memoryview(bytearray(size))
    pieces: list[tuple[int, int, TensorSource | None]] = [(0, len(meta), None)]  # (offset, length, source)
    pieces += [(e.offset, e.nbytes, s) for s, e in zip(sources, entries, strict=True)]
    piece = 0
    for seg_start in range(0, max(total, 1), size):
        seg = buffer[: min(size, total - seg_start)]
        cursor = seg_start
        seg_end = seg_start + len(seg)
        while cursor < seg_end:
            offset, length, source = pieces[piece]
            if cursor < offset:  # alignment padding before the next tensor
                gap = min(offset, seg_end) - cursor
                seg[cursor - seg_start : cursor - seg_start + gap] = _ZEROS[:gap]
                cursor += gap
                continue
            take = min(offset + length, seg_end) - cursor
            out = seg[cursor - seg_start : cursor - seg_start + take]
            if source is None:
                out[:] = meta[cursor : cursor + take]
            else:
                source.read_into(cursor - offset, out)
            cursor += take
            if cursor == offset + length:
                piece += 1
        yield seg


# Parts the engine fuses into one matrix (models/llama.py), in fusion order.
_FUSED_GROUPS = (("self_attn.", ("q_proj", "k_proj", "v_proj")), ("mlp.", ("gate_proj", "up_proj")))


def fusion_adjacent_order(tensors: Sequence[tuple[str, T]]) -> list[tuple[str, T]]:
    """The given order, except that parts the engine fuses (q/k/v, gate/up; weights and biases) sit
    next to each other in fusion order, at the first part's place.

    The payload layout is free (every offset is in the signed manifest); laid out this way, the
    worker fuses them as a view of the decrypted buffer instead of a second copy.
    """
    by_name = dict(tensors)
    placed: set[str] = set()
    out: list[tuple[str, T]] = []
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
    tensors: Sequence[tuple[str, torch.Tensor | TensorSource]],
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

    `tensors`: in memory, or sources read on demand (sources.py: a safetensors file's tensors), so
    that memory stays at a few segment buffers whatever the model size. Two passes over the
    plaintext: the digest (signed in the manifest, which every segment's AD binds), then encryption.

    `signing_key`: an Ed25519 private key, or a ModelSigningKey (OpenSSF model-signing, EC key).
    """
    meta = metadata_to_bytes(metadata)
    ordered = fusion_adjacent_order([(n, InMemoryTensor(t) if isinstance(t, torch.Tensor) else t)
                                     for n, t in tensors])
    sources = [source for _, source in ordered]
    entries: list[TensorEntry] = []
    cursor = len(meta)
    for name, source in ordered:
        offset = aligned(cursor)
        if source.dtype not in _DTYPE_NAMES:
            raise PackageFormatError(f"tensor {name}: dtype {source.dtype} is not supported by the format")
        entries.append(TensorEntry(name, _DTYPE_NAMES[source.dtype], tuple(source.shape), offset, source.nbytes))
        cursor = offset + source.nbytes
    package_id = secrets.token_hex(16)
    manifest = Manifest(
        package_id=package_id, tenant=tenant, model=model, version=version, key_id=key_id,
        segment_size=segment_size, num_segments=max(1, -(-cursor // segment_size)),
        plaintext_bytes=cursor, plaintext_digest=_digest(meta, sources, entries, digest_alg),
        metadata_bytes=len(meta),
        key_check=key_check_value(data_key, package_id), signer=signer_identity(signing_key.public_key()),
        tensors=tuple(entries),
    )
    manifest_bytes = manifest.to_bytes()
    prefix = ad_prefix(package_id, manifest_bytes)
    cipher = algorithms.AES(segment_key(data_key, package_id))
    out = memoryview(bytearray(segment_size + TAG_BYTES + 16))  # update_into wants a block's slack
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = out_dir / "payload.bin.partial"
    with open(tmp, "wb") as fh:
        for i, segment in enumerate(_segments(meta, sources, entries, cursor, segment_size)):
            final = i == manifest.num_segments - 1
            # update_into a reused buffer: AESGCM.encrypt would allocate (and page-fault) a fresh
            # ciphertext per segment; same bytes (ciphertext || tag).
            encryptor = Cipher(cipher, modes.GCM(nonce_for(i, final))).encryptor()
            encryptor.authenticate_additional_data(associated_data(prefix, i, final))
            n = encryptor.update_into(segment, out)
            encryptor.finalize()
            out[n : n + TAG_BYTES] = encryptor.tag
            fh.write(out[: n + TAG_BYTES])
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
