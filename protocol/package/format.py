"""Package format v2 (the threat model and the reasons are in docs/package-format.md).

Layout of a package directory:
  manifest.json   canonical JSON (sorted keys, no spaces): public metadata, authenticated below
  manifest.sig    signature by the tenant over manifest.json (see signing.py)
  payload.bin     segments; segment i = AES-256-GCM(plaintext[i*S:(i+1)*S]) || 16-byte tag

The plaintext stream is the model's metadata JSON, then each tensor's bytes, each aligned to 64.
Segment key = HKDF-SHA256(data key, salt=package_id, info="sealed-pkg-v2 segment"), so every
package (and so every model version) has its own key even if a data key were ever reused.
Nonce(i) = i (8 bytes, big-endian) || final flag (1 byte) || 3 zero bytes: unique per key.
Associated data(i) = "sealed-pkg-v2" || package_id || SHA-256(manifest.json) || i || final flag,
so the header is authenticated, and no segment can be reordered, dropped, appended or spliced in
from another package or version. key_check commits the manifest to one data key (AES-GCM alone is
not key-committing), which also reports a wrong key before any segment is touched.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from dataclasses import dataclass, field
from typing import Any, Protocol

import blake3
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from protocol.model_ref import ModelRef
from protocol.package.errors import PackageFormatError

FORMAT_VERSION = 2
TAG_BYTES = 16
ALIGN = 64
# Upload (api/management/uploads.py <- api/cli/upload.py): each chunk's SHA-256, checked before the
# server acknowledges the chunk.
UPLOAD_CHUNK_DIGEST_HEADER = "x-sealed-chunk-sha256"
DEFAULT_SEGMENT_SIZE = 4 << 20  # large segments: per-segment setup cost vanishes, tags stay cheap
MAX_SEGMENT_SIZE = 1 << 26
DTYPES = ("float32", "float16", "bfloat16", "int8", "uint8", "int32", "int64")
DIGEST_ALGS = ("blake3", "sha256")
# What a package serves: a chat (decoder) model, or a sentence-embedding (encoder) model for
# /v1/embeddings. Public and signed, so the upload check and the catalog know it without the key; the
# worker checks it against the decrypted config. "chat" is left out of manifest.json (older packages).
MODEL_KINDS = ("chat", "embedding")
DEFAULT_DIGEST_ALG = "blake3"  # collision resistant, keyless, ~4x faster than SHA-256 here
_AD_LABEL = b"sealed-pkg-v2"


class Hasher(Protocol):
    def update(self, data: Any, /) -> object: ...
    def hexdigest(self) -> str: ...


def new_hasher(alg: str, threads: int = 1) -> Hasher:
    """`threads` > 1: BLAKE3 hashes one large update on that many threads (its tree mode; the
    digest is the same). SHA-256 has one thread whatever is asked."""
    if alg == "blake3":
        return blake3.blake3(max_threads=threads) if threads > 1 else blake3.blake3()
    if alg == "sha256":
        return hashlib.sha256()
    raise PackageFormatError(f"unsupported digest algorithm {alg!r}")


@dataclass(frozen=True)
class TensorEntry:
    name: str
    dtype: str
    shape: tuple[int, ...]
    offset: int
    nbytes: int


@dataclass(frozen=True)
class Manifest:
    package_id: str  # 32 hex chars, random per package
    tenant: str
    model: str
    version: str
    key_id: str
    segment_size: int
    num_segments: int
    plaintext_bytes: int
    plaintext_digest: str  # "<alg>:<hex>" over the whole plaintext stream
    metadata_bytes: int
    key_check: str
    signer: str
    tensors: tuple[TensorEntry, ...] = field(default_factory=tuple)
    format_version: int = FORMAT_VERSION
    kind: str = "chat"  # one of MODEL_KINDS

    @property
    def ref(self) -> ModelRef:
        return ModelRef(self.tenant, self.model, self.version)

    @property
    def plaintext_sha256(self) -> str:
        """Alias kept for callers written against v1: the signed plaintext digest, algorithm-prefixed."""
        return self.plaintext_digest

    @property
    def digest_alg(self) -> str:
        return self.plaintext_digest.split(":", 1)[0]

    @property
    def payload_bytes(self) -> int:
        return self.plaintext_bytes + self.num_segments * TAG_BYTES

    def segment_len(self, index: int) -> int:
        """Plaintext bytes in segment `index` (the ciphertext adds TAG_BYTES)."""
        return min(self.segment_size, self.plaintext_bytes - index * self.segment_size)

    def to_bytes(self) -> bytes:
        doc = {
            "format_version": self.format_version, "package_id": self.package_id, "tenant": self.tenant,
            "model": self.model, "version": self.version, "key_id": self.key_id,
            "segment_size": self.segment_size, "num_segments": self.num_segments,
            "plaintext_bytes": self.plaintext_bytes, "plaintext_digest": self.plaintext_digest,
            "metadata_bytes": self.metadata_bytes, "key_check": self.key_check, "signer": self.signer,
            "tensors": [
                {"name": t.name, "dtype": t.dtype, "shape": list(t.shape), "offset": t.offset,
                 "nbytes": t.nbytes}
                for t in self.tensors
            ],
        }
        if self.kind != "chat":
            doc["kind"] = self.kind
        return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, raw: bytes) -> Manifest:
        try:
            doc = json.loads(raw)
            if doc["format_version"] != FORMAT_VERSION:
                raise PackageFormatError(f"unsupported package format {doc['format_version']!r}")
            tensors = tuple(
                TensorEntry(str(t["name"]), str(t["dtype"]), tuple(int(d) for d in t["shape"]),
                            int(t["offset"]), int(t["nbytes"]))
                for t in doc["tensors"]
            )
            manifest = cls(
                package_id=str(doc["package_id"]), tenant=str(doc["tenant"]), model=str(doc["model"]),
                version=str(doc["version"]), key_id=str(doc["key_id"]), segment_size=int(doc["segment_size"]),
                num_segments=int(doc["num_segments"]), plaintext_bytes=int(doc["plaintext_bytes"]),
                plaintext_digest=str(doc["plaintext_digest"]), metadata_bytes=int(doc["metadata_bytes"]),
                key_check=str(doc["key_check"]), signer=str(doc["signer"]), tensors=tensors,
                kind=str(doc.get("kind", "chat")),
            )
        except PackageFormatError:
            raise
        except (KeyError, TypeError, ValueError, RecursionError) as exc:  # RecursionError: deep nesting
            raise PackageFormatError(f"malformed manifest: {str(exc)[:200]}") from exc
        if manifest.to_bytes() != raw:
            raise PackageFormatError("manifest is not in canonical form")
        manifest.check_layout()
        return manifest

    def check_layout(self) -> None:
        """Every tensor lies inside the plaintext, aligned, without overlap, with a consistent size."""
        if not 0 < self.segment_size <= MAX_SEGMENT_SIZE:
            raise PackageFormatError("segment size out of range")
        if self.kind not in MODEL_KINDS:
            raise PackageFormatError(f"unsupported model kind {self.kind!r} (one of {', '.join(MODEL_KINDS)})")
        try:
            if len(bytes.fromhex(self.package_id)) != 16:
                raise ValueError
        except ValueError:
            raise PackageFormatError("package_id must be 16 bytes hex") from None
        if self.digest_alg not in DIGEST_ALGS:
            raise PackageFormatError(f"unsupported digest algorithm {self.digest_alg!r}")
        if not 0 <= self.metadata_bytes <= self.plaintext_bytes:
            raise PackageFormatError("metadata size out of range")
        expected_segments = max(1, -(-self.plaintext_bytes // self.segment_size))
        if self.num_segments != expected_segments:
            raise PackageFormatError("segment count does not match the plaintext size")
        cursor = self.metadata_bytes
        for t in self.tensors:
            if t.dtype not in DTYPES:
                raise PackageFormatError(f"tensor {t.name}: unsupported dtype {t.dtype}")
            if t.offset % ALIGN or t.offset < cursor or t.offset + t.nbytes > self.plaintext_bytes:
                raise PackageFormatError(f"tensor {t.name}: bad offset")
            if any(d < 0 for d in t.shape):
                raise PackageFormatError(f"tensor {t.name}: negative dimension")
            count = 1
            for d in t.shape:
                count *= d
            if count * _ITEMSIZE[t.dtype] != t.nbytes:
                raise PackageFormatError(f"tensor {t.name}: shape and dtype do not match its size")
            cursor = t.offset + t.nbytes


_ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2, "int8": 1, "uint8": 1, "int32": 4, "int64": 8}


def segment_key(data_key: bytes, package_id: str) -> bytes:
    if len(data_key) != 32:
        raise ValueError("data key must be 32 bytes")
    return HKDF(hashes.SHA256(), 32, bytes.fromhex(package_id), b"sealed-pkg-v2 segment").derive(data_key)


def key_check_value(data_key: bytes, package_id: str) -> str:
    salt = bytes.fromhex(package_id)
    check_key = HKDF(hashes.SHA256(), 32, salt, b"sealed-pkg-v2 key-check").derive(data_key)
    return hmac.new(check_key, b"sealed-pkg-v2 key-check", hashlib.sha256).hexdigest()


def nonce_for(index: int, final: bool) -> bytes:
    return index.to_bytes(8, "big") + (b"\x01" if final else b"\x00") + b"\x00\x00\x00"


def ad_prefix(package_id: str, manifest_bytes: bytes) -> bytes:
    """The per-package part of every segment's associated data."""
    return _AD_LABEL + bytes.fromhex(package_id) + hashlib.sha256(manifest_bytes).digest()


def associated_data(prefix: bytes, index: int, final: bool) -> bytes:
    return prefix + index.to_bytes(8, "big") + (b"\x01" if final else b"\x00")


def aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def metadata_to_bytes(metadata: dict[str, Any]) -> bytes:
    return json.dumps(metadata, sort_keys=True, separators=(",", ":")).encode()


def manifest_names(manifest: Manifest, ref: ModelRef) -> bool:
    """Whether a (not yet trusted) manifest is for exactly this model version."""
    return (manifest.tenant, manifest.model, manifest.version) == (ref.tenant, ref.model, ref.version)
