"""The data key in transit from the tenant to a key broker: HPKE-sealed to the broker's import key.

`sealed encrypt` never writes the data key in the clear. It seals it (RFC 9180 base mode,
DHKEM(X25519, HKDF-SHA256), HKDF-SHA256, AES-256-GCM) to a key broker's published X25519 import
public key; the broker opens it and wraps it under the tenant's key in its key store. The HPKE
info binds tenant, model, version, key id, package id and the import key id, so a sealed key
cannot be replayed as the key of another package or to another broker. With "hold your own key"
the broker is the tenant's own deployment and so is its import key.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from dataclasses import asdict, dataclass
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.hpke import AEAD, KDF, KEM, Suite

from protocol.model_ref import ModelRef
from protocol.package.errors import KeySealError
from protocol.package.format import Manifest, key_check_value

SEALED_KEY_FORMAT = "sealed-datakey-v1"
_SUITE = Suite(KEM.X25519, KDF.HKDF_SHA256, AEAD.AES_256_GCM)


def import_key_id(public_key: X25519PublicKey) -> str:
    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return "x25519:" + hashlib.sha256(raw).hexdigest()[:32]


@dataclass(frozen=True)
class SealedDataKey:
    tenant: str
    model: str
    version: str
    key_id: str
    package_id: str
    import_key_id: str
    sealed: str  # base64 of HPKE enc || ciphertext
    format: str = SEALED_KEY_FORMAT

    @property
    def ref(self) -> ModelRef:
        return ModelRef(self.tenant, self.model, self.version)

    def info(self) -> bytes:
        """HPKE info: every field but the ciphertext, canonical JSON."""
        doc = asdict(self)
        del doc["sealed"]
        return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True, indent=1)

    @classmethod
    def from_json(cls, text: str) -> SealedDataKey:
        try:
            doc = json.loads(text)
            if doc.get("format") != SEALED_KEY_FORMAT:
                raise KeySealError(f"unsupported sealed key format {doc.get('format')!r}")
            return cls(**{k: str(doc[k]) for k in ("tenant", "model", "version", "key_id", "package_id",
                                                     "import_key_id", "sealed")})
        except KeySealError:
            raise
        except (KeyError, TypeError, ValueError, RecursionError, AttributeError) as exc:  # Attribute: not an object
            raise KeySealError(f"malformed sealed key: {str(exc)[:200]}") from exc


def seal_data_key(data_key: bytes, manifest: Manifest, import_public_key: X25519PublicKey) -> SealedDataKey:
    unsealed = SealedDataKey(manifest.tenant, manifest.model, manifest.version, manifest.key_id,
                             manifest.package_id, import_key_id(import_public_key), "")
    sealed = _SUITE.encrypt(data_key, import_public_key, info=unsealed.info())
    return SealedDataKey(**{**asdict(unsealed), "sealed": base64.b64encode(sealed).decode()})


def open_data_key(sealed: SealedDataKey, private_key: X25519PrivateKey,
                  manifest: Manifest | None = None) -> bytes:
    """Open a sealed data key; with the manifest, also check it is this package's committed key."""
    if sealed.import_key_id != import_key_id(private_key.public_key()):
        raise KeySealError("sealed to another import key")
    try:
        ciphertext = base64.b64decode(sealed.sealed, validate=True)
        data_key = _SUITE.decrypt(ciphertext, private_key, info=sealed.info())
    except (InvalidTag, ValueError) as exc:
        raise KeySealError("sealed data key does not open (tampered, or bound to another context)") from exc
    if manifest is not None:
        names = (manifest.tenant, manifest.model, manifest.version, manifest.key_id, manifest.package_id)
        if names != (sealed.tenant, sealed.model, sealed.version, sealed.key_id, sealed.package_id):
            raise KeySealError("sealed data key belongs to another package")
        if not hmac.compare_digest(key_check_value(data_key, manifest.package_id), manifest.key_check):
            raise KeySealError("sealed data key is not the key the package commits to")
    return data_key


def load_import_public_key(path: Path) -> X25519PublicKey:
    """A broker's published import key: PEM (SubjectPublicKeyInfo) or 32 raw bytes as hex."""
    data = Path(path).read_bytes()
    try:
        if data.lstrip().startswith(b"-----BEGIN"):
            key = serialization.load_pem_public_key(data)
        else:
            key = X25519PublicKey.from_public_bytes(bytes.fromhex(data.decode().strip()))
    except ValueError as exc:
        raise KeySealError(f"not an X25519 public key: {path}") from exc
    if not isinstance(key, X25519PublicKey):
        raise KeySealError(f"import key must be X25519: {path}")
    return key


def public_pem(key: X25519PrivateKey) -> bytes:
    return key.public_key().public_bytes(serialization.Encoding.PEM,
                                         serialization.PublicFormat.SubjectPublicKeyInfo)


def sealed_upload_body(pkg_dir: Path, sealed: SealedDataKey) -> dict[str, object]:
    """The body of the broker's `PUT .../data-key`: the sealed key plus the package's signed
    manifest, so the broker registers the key only for exactly that signed package."""
    from protocol.package.signing import SIGNATURE_FILES

    return {
        "sealed_key": json.loads(sealed.to_json()),
        "manifest": base64.b64encode((pkg_dir / "manifest.json").read_bytes()).decode(),
        "signature_files": {name: base64.b64encode((pkg_dir / name).read_bytes()).decode()
                            for name in SIGNATURE_FILES if (pkg_dir / name).exists()},
    }
