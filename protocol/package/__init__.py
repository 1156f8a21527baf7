"""Encrypted model packages as every role sees them: the manifest and segment format, the
tenant's signature over the manifest, and the data key sealed to a key broker's import key.

Shared by the tenant's tools (`api`), the key broker (registers a sealed key for a signed
manifest) and the worker (verifies and decrypts). No torch here: the worker's decryption into
tensor memory and the tenant's writer live in `enclave_worker.package`."""

from protocol.package.errors import (
    KeySealError,
    PackageError,
    PackageFormatError,
    PackageIntegrityError,
    PackageSignatureError,
    UploadError,
    WrongKeyError,
)
from protocol.package.format import Manifest, TensorEntry
from protocol.package.signing import read_manifest

__all__ = [
    "KeySealError",
    "Manifest",
    "PackageError",
    "PackageFormatError",
    "PackageIntegrityError",
    "PackageSignatureError",
    "TensorEntry",
    "UploadError",
    "WrongKeyError",
    "read_manifest",
]
