"""Tenant signatures over the manifest. Two methods, chosen by the key the tenant signs with:

- OpenSSF model-signing (`model-signing`, key method, offline): an EC private key (PEM file)
  signs a Sigstore bundle (DSSE, in-toto statement) over the package directory with everything
  but manifest.json ignored: the manifest binds the payload (every segment's associated data
  holds its hash, and it carries the signed plaintext digest), so hashing gigabytes of
  ciphertext again at every verification would add cost and no assurance. Files: model.sig,
  signer.pub.pem. Identity: "ecdsa-<curve>:" + SHA-256(SubjectPublicKeyInfo)[:32 hex].
- Ed25519 (the original format, kept for the one-machine demo): manifest.sig holds the public
  key and the signature. Identity: "ed25519:" + SHA-256(raw public key)[:32 hex].

The manifest names its signer; verification checks that the signature verifies under a key whose
identity is that name, and callers pin the name (a release policy's required signer).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from protocol.package.errors import PackageFormatError, PackageSignatureError
from protocol.package.format import Manifest

SIGNATURE_FILE = "manifest.sig"
MODEL_SIGNING_FILE = "model.sig"
SIGNER_KEY_FILE = "signer.pub.pem"
SIGNATURE_FILES = (SIGNATURE_FILE, MODEL_SIGNING_FILE, SIGNER_KEY_FILE)
_IGNORED = ("payload.bin", "payload.bin.partial", *SIGNATURE_FILES)


@dataclass(frozen=True)
class ModelSigningKey:
    """An EC private key in a PEM file, used through OpenSSF model-signing's key method."""

    private_key: Path
    password: str | None = None

    def public_key(self) -> ec.EllipticCurvePublicKey:
        key = serialization.load_pem_private_key(
            self.private_key.read_bytes(), self.password.encode() if self.password else None)
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise PackageSignatureError("model-signing's key method needs an EC private key")
        return key.public_key()


SigningKey = Ed25519PrivateKey | ModelSigningKey


def signer_identity(public_key: Ed25519PublicKey | ec.EllipticCurvePublicKey) -> str:
    if isinstance(public_key, Ed25519PublicKey):
        raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        return "ed25519:" + hashlib.sha256(raw).hexdigest()[:32]
    spki = public_key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return f"ecdsa-{public_key.curve.name}:" + hashlib.sha256(spki).hexdigest()[:32]


def sign_manifest(pkg_dir: Path, manifest_bytes: bytes, key: SigningKey) -> None:
    """Sign the manifest already written at pkg_dir/manifest.json (its bytes are `manifest_bytes`)."""
    if isinstance(key, ModelSigningKey):
        _model_signing_sign(pkg_dir, key)
        return
    raw_pub = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    doc = {
        "alg": "ed25519",
        "public_key": base64.b64encode(raw_pub).decode(),
        "signature": base64.b64encode(key.sign(manifest_bytes)).decode(),
    }
    (pkg_dir / SIGNATURE_FILE).write_text(json.dumps(doc, sort_keys=True))


def verify_manifest_signature(pkg_dir: Path, manifest_bytes: bytes, claimed_signer: str) -> str:
    """Verify the package's signature; returns the signer identity, which must equal the manifest's claim."""
    if claimed_signer.startswith("ecdsa-"):
        return _model_signing_verify(pkg_dir, manifest_bytes, claimed_signer)
    try:
        doc = json.loads((pkg_dir / SIGNATURE_FILE).read_text())
        public_key = Ed25519PublicKey.from_public_bytes(base64.b64decode(doc["public_key"], validate=True))
        signature = base64.b64decode(doc["signature"], validate=True)
    except (OSError, KeyError, TypeError, ValueError, RecursionError) as exc:
        raise PackageSignatureError(f"manifest signature missing or malformed: {exc}") from exc
    try:
        public_key.verify(signature, manifest_bytes)
    except InvalidSignature as exc:
        raise PackageSignatureError("manifest signature does not verify") from exc
    identity = signer_identity(public_key)
    if identity != claimed_signer:
        raise PackageSignatureError("manifest names a different signer than the one that signed it")
    return identity


def _hashing_config() -> Any:  # model_signing.hashing.Config (the library has no type hints)
    import model_signing

    return model_signing.hashing.Config().set_ignored_paths(paths=list(_IGNORED), ignore_git_paths=True)


def _model_signing_sign(pkg_dir: Path, key: ModelSigningKey) -> None:
    import model_signing

    (pkg_dir / SIGNER_KEY_FILE).write_bytes(key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    (model_signing.signing.Config().set_hashing_config(_hashing_config())
     .use_elliptic_key_signer(private_key=key.private_key, password=key.password)
     .sign(pkg_dir, pkg_dir / MODEL_SIGNING_FILE))


def _model_signing_verify(pkg_dir: Path, manifest_bytes: bytes, claimed_signer: str) -> str:
    import model_signing

    try:
        public_key = serialization.load_pem_public_key((pkg_dir / SIGNER_KEY_FILE).read_bytes())
        bundle = json.loads((pkg_dir / MODEL_SIGNING_FILE).read_text())
        statement = json.loads(base64.b64decode(bundle["dsseEnvelope"]["payload"], validate=True))
        resources = {r["name"]: r for r in statement["predicate"]["resources"]}
    except (OSError, KeyError, TypeError, ValueError, RecursionError) as exc:
        raise PackageSignatureError(f"model signature missing or malformed: {exc}") from exc
    if not isinstance(public_key, ec.EllipticCurvePublicKey):
        raise PackageSignatureError("the signer key is not an EC public key")
    identity = signer_identity(public_key)
    if identity != claimed_signer:
        raise PackageSignatureError("manifest names a different signer than the one that signed it")
    try:
        (model_signing.verifying.Config().use_elliptic_key_verifier(public_key=pkg_dir / SIGNER_KEY_FILE)
         .set_ignore_unsigned_files(True).verify(pkg_dir, pkg_dir / MODEL_SIGNING_FILE))
    except Exception as exc:  # model-signing raises ValueError and library-specific errors alike
        raise PackageSignatureError(f"model signature does not verify: {exc}") from exc
    # The statement must cover the very manifest bytes we parsed (not just the file on disk now).
    entry = resources.get("manifest.json", {})
    if set(resources) != {"manifest.json"} or entry.get("algorithm") != "sha256" or \
            entry.get("digest") != hashlib.sha256(manifest_bytes).hexdigest():
        raise PackageSignatureError("model signature does not cover this manifest")
    return identity


def read_manifest(pkg_dir: Path, *, required_signer: str | None = None) -> tuple[Manifest, bytes, str]:
    """Parse and verify the manifest and its signature; returns (manifest, raw bytes, signer)."""
    try:
        raw = (Path(pkg_dir) / "manifest.json").read_bytes()
    except OSError as exc:
        raise PackageFormatError(f"no manifest in {pkg_dir}") from exc
    manifest = Manifest.from_bytes(raw)
    signer = verify_manifest_signature(Path(pkg_dir), raw, manifest.signer)
    if required_signer is not None and not hmac.compare_digest(signer, required_signer):
        raise PackageSignatureError("package signer is not the required signer")
    return manifest, raw, signer
