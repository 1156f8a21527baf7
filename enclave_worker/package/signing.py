"""Tenant signatures over the manifest (Ed25519). The signer identity is the key's fingerprint."""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from enclave_worker.package.errors import PackageSignatureError

SIGNATURE_FILE = "manifest.sig"


def signer_identity(public_key: Ed25519PublicKey) -> str:
    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return "ed25519:" + hashlib.sha256(raw).hexdigest()[:32]


def sign_manifest(pkg_dir: Path, manifest_bytes: bytes, key: Ed25519PrivateKey) -> None:
    raw_pub = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    doc = {
        "alg": "ed25519",
        "public_key": base64.b64encode(raw_pub).decode(),
        "signature": base64.b64encode(key.sign(manifest_bytes)).decode(),
    }
    (pkg_dir / SIGNATURE_FILE).write_text(json.dumps(doc, sort_keys=True))


def verify_manifest_signature(pkg_dir: Path, manifest_bytes: bytes, claimed_signer: str) -> str:
    """Verify manifest.sig; returns the signer identity, which must equal the manifest's claim."""
    try:
        doc = json.loads((pkg_dir / SIGNATURE_FILE).read_text())
        public_key = Ed25519PublicKey.from_public_bytes(base64.b64decode(doc["public_key"], validate=True))
        signature = base64.b64decode(doc["signature"], validate=True)
    except (OSError, KeyError, TypeError, ValueError) as exc:
        raise PackageSignatureError(f"manifest signature missing or malformed: {exc}") from exc
    try:
        public_key.verify(signature, manifest_bytes)
    except InvalidSignature as exc:
        raise PackageSignatureError("manifest signature does not verify") from exc
    identity = signer_identity(public_key)
    if identity != claimed_signer:
        raise PackageSignatureError("manifest names a different signer than the one that signed it")
    return identity
