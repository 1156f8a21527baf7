"""Package format v1.

Layout of a package directory:
  manifest.json   canonical JSON (sorted keys, no spaces): public metadata, authenticated below
  manifest.sig    Ed25519 signature by the tenant over manifest.json
  payload.bin     segments; segment i = AES-256-GCM(plaintext[i*S:(i+1)*S]) || 16-byte tag

The plaintext stream is the model's metadata JSON, then each tensor's bytes, each aligned to 64.
Per-package segment key = HKDF-SHA256(data key, salt=package_id, info="sealed-pkg-v1 segment").
Nonce(i) = i (8 bytes, big-endian) || final flag (1 byte) || 3 zero bytes. Associated data =
SHA-256(manifest.json) || i || final flag. So the header is authenticated, segments cannot be
reordered, dropped, appended or spliced in from another package (other package_id, other
manifest), and a wrong data key is caught by the key-check value before any segment is touched.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from dataclasses import dataclass, field
from typing import Any

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from enclave_worker.package.errors import PackageFormatError

FORMAT_VERSION = 1
TAG_BYTES = 16
ALIGN = 64
DEFAULT_SEGMENT_SIZE = 1 << 20
MAX_SEGMENT_SIZE = 1 << 26
DTYPES = ("float32", "float16", "bfloat16", "int8", "uint8", "int32", "int64")


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
    plaintext_sha256: str
    metadata_bytes: int
    key_check: str
    signer: str
    tensors: tuple[TensorEntry, ...] = field(default_factory=tuple)
    format_version: int = FORMAT_VERSION

    def to_bytes(self) -> bytes:
        doc = {
            "format_version": self.format_version,
            "package_id": self.package_id,
            "tenant": self.tenant,
            "model": self.model,
            "version": self.version,
            "key_id": self.key_id,
            "segment_size": self.segment_size,
            "num_segments": self.num_segments,
            "plaintext_bytes": self.plaintext_bytes,
            "plaintext_sha256": self.plaintext_sha256,
            "metadata_bytes": self.metadata_bytes,
            "key_check": self.key_check,
            "signer": self.signer,
            "tensors": [
                {"name": t.name, "dtype": t.dtype, "shape": list(t.shape), "offset": t.offset, "nbytes": t.nbytes}
                for t in self.tensors
            ],
        }
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
                plaintext_sha256=str(doc["plaintext_sha256"]), metadata_bytes=int(doc["metadata_bytes"]),
                key_check=str(doc["key_check"]), signer=str(doc["signer"]), tensors=tensors,
            )
        except PackageFormatError:
            raise
        except (KeyError, TypeError, ValueError, UnicodeDecodeError) as exc:
            raise PackageFormatError(f"malformed manifest: {exc}") from exc
        if manifest.to_bytes() != raw:
            raise PackageFormatError("manifest is not in canonical form")
        manifest.check_layout()
        return manifest

    def check_layout(self) -> None:
        """Every tensor lies inside the plaintext, aligned, without overlap, with a consistent size."""
        if not 0 < self.segment_size <= MAX_SEGMENT_SIZE:
            raise PackageFormatError("segment size out of range")
        if len(bytes.fromhex(self.package_id)) != 16:
            raise PackageFormatError("package_id must be 16 bytes hex")
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
            cursor = t.offset + t.nbytes


def segment_key(data_key: bytes, package_id: str) -> bytes:
    if len(data_key) != 32:
        raise ValueError("data key must be 32 bytes")
    return HKDF(hashes.SHA256(), 32, bytes.fromhex(package_id), b"sealed-pkg-v1 segment").derive(data_key)


def key_check_value(data_key: bytes, package_id: str) -> str:
    check_key = HKDF(hashes.SHA256(), 32, bytes.fromhex(package_id), b"sealed-pkg-v1 key-check").derive(data_key)
    return hmac.new(check_key, b"sealed-pkg-v1 key-check", hashlib.sha256).hexdigest()


def nonce_for(index: int, final: bool) -> bytes:
    return index.to_bytes(8, "big") + (b"\x01" if final else b"\x00") + b"\x00\x00\x00"


def associated_data(manifest_digest: bytes, index: int, final: bool) -> bytes:
    return manifest_digest + index.to_bytes(8, "big") + (b"\x01" if final else b"\x00")


def aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def metadata_to_bytes(metadata: dict[str, Any]) -> bytes:
    return json.dumps(metadata, sort_keys=True, separators=(",", ":")).encode()
