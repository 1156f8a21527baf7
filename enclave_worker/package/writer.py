"""Tenant side: encrypt a model's tensors into a package (runs on the tenant's own machine)."""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import torch
from cryptography.hazmat.primitives.ciphers import algorithms

from enclave_worker.package.encrypt_segments import default_threads, encrypt_segments
from enclave_worker.package.sources import InMemoryTensor, TensorSource
from protocol.package.errors import PackageFormatError
from protocol.package.format import (
    DEFAULT_DIGEST_ALG,
    DEFAULT_SEGMENT_SIZE,
    MODEL_KINDS,
    Manifest,
    TensorEntry,
    ad_prefix,
    aligned,
    key_check_value,
    metadata_to_bytes,
    new_hasher,
    segment_key,
)
from protocol.package.signing import SIGNATURE_FILES, SigningKey, sign_manifest, signer_identity

T = TypeVar("T")
_DTYPE_NAMES = {
    torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16",
    torch.int8: "int8", torch.uint8: "uint8", torch.int32: "int32", torch.int64: "int64",
}


_ZEROS = bytes(64)  # the padding before a 64-byte aligned tensor is shorter than this


def _pieces(meta: bytes, sources: Sequence[TensorSource], entries: Sequence[TensorEntry], start: int,
            end: int) -> Iterator[memoryview]:
    """The plaintext stream's bytes [start, end) as views: metadata, alignment padding, tensors."""
    cursor = 0
    parts: list[tuple[int, int, TensorSource | None]] = [(0, len(meta), None)]
    parts += [(e.offset, e.nbytes, s) for s, e in zip(sources, entries, strict=True)]
    for offset, length, source in parts:
        if offset > cursor and offset > start and cursor < end:  # padding before this part
            yield memoryview(_ZEROS)[: min(offset, end) - max(cursor, start)]
        lo, hi = max(offset, start), min(offset + length, end)
        if lo < hi:
            if source is None:
                yield memoryview(meta)[lo:hi]
            else:
                yield from source.views(lo - offset, hi - lo)
        cursor = offset + length
        if cursor >= end:
            return


def _digest(meta: bytes, sources: Sequence[TensorSource], entries: Sequence[TensorEntry], total: int,
            alg: str, threads: int) -> str:
    """First pass: the plaintext digest, which the manifest signs and every segment's AD binds
    (BLAKE3 spreads each 64 MiB window over `threads` cores)."""
    hasher = new_hasher(alg, threads)
    for view in _pieces(meta, sources, entries, 0, total):
        hasher.update(view)
    return f"{alg}:{hasher.hexdigest()}"


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
    kind: str = "chat",
    threads: int | None = None,
) -> Manifest:
    """Write manifest.json, its signature and payload.bin. Plaintext never touches the disk.

    `tensors`: in memory, or sources read on demand (sources.py: a safetensors file's tensors), so
    that memory stays at a few segment buffers whatever the model size. Two passes over the
    plaintext: the digest (signed in the manifest, which every segment's AD binds), then encryption.

    `threads`: segments encrypted at once (encrypt_segments.py; default one per core, at most 4).

    `signing_key`: an Ed25519 private key, or a ModelSigningKey (OpenSSF model-signing, EC key).
    """
    if kind not in MODEL_KINDS:  # refused before anything is written
        raise PackageFormatError(f"unsupported model kind {kind!r} (one of {', '.join(MODEL_KINDS)})")
    if threads is not None and threads < 1:  # before any work
        raise ValueError(f"threads must be at least 1, not {threads}")
    meta = metadata_to_bytes(metadata)
    threads = threads or default_threads()
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
        plaintext_bytes=cursor, plaintext_digest=_digest(meta, sources, entries, cursor, digest_alg, threads),
        metadata_bytes=len(meta),
        key_check=key_check_value(data_key, package_id), signer=signer_identity(signing_key.public_key()),
        tensors=tuple(entries), kind=kind,
    )
    manifest_bytes = manifest.to_bytes()
    prefix = ad_prefix(package_id, manifest_bytes)
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = out_dir / "payload.bin.partial"
    with open(tmp, "wb") as fh:
        encrypt_segments(fh, lambda start, end: _pieces(meta, sources, entries, start, end),
                         key=algorithms.AES(segment_key(data_key, package_id)), ad_prefix=prefix, total=cursor,
                         segment_size=segment_size, num_segments=manifest.num_segments,
                         threads=threads, progress=progress)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, out_dir / "payload.bin")
    (out_dir / "manifest.json").write_bytes(manifest_bytes)
    for stale in SIGNATURE_FILES:  # a rewritten package must not keep the other method's signature
        (out_dir / stale).unlink(missing_ok=True)
    sign_manifest(out_dir, manifest_bytes, signing_key)
    return manifest
