"""Encrypted model packages: manifest + AES-256-GCM segments, decrypted straight into tensor memory."""

from enclave_worker.package.errors import (
    KeySealError,
    PackageError,
    PackageFormatError,
    PackageIntegrityError,
    PackageSignatureError,
    UploadError,
    WrongKeyError,
)
from enclave_worker.package.format import Manifest, TensorEntry
from enclave_worker.package.reader import DecryptedModel, decrypt_package, read_manifest
from enclave_worker.package.writer import write_package

__all__ = [
    "DecryptedModel",
    "KeySealError",
    "Manifest",
    "PackageError",
    "PackageFormatError",
    "PackageIntegrityError",
    "PackageSignatureError",
    "TensorEntry",
    "UploadError",
    "WrongKeyError",
    "decrypt_package",
    "read_manifest",
    "write_package",
]
