"""HPKE (RFC 9180) sealing of data keys to a worker's attested ephemeral key.

Suite: DHKEM(X25519, HKDF-SHA256), HKDF-SHA256, AES-256-GCM. The info string binds the sealed key
to its tenant, model, version and the attestation token's id, so a sealed key cannot be replayed
into another context even by the worker that holds the private key.
"""

from __future__ import annotations

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.hpke import AEAD, KDF, KEM, Suite

from protocol.model_ref import ModelRef

_SUITE = Suite(KEM.X25519, KDF.HKDF_SHA256, AEAD.AES_256_GCM)


def release_info(ref: ModelRef, token_id: str) -> bytes:
    return f"sealed-key-release-v1|{ref.tenant}|{ref.model}|{ref.version}|{token_id}".encode()


def seal(data_key: bytes, recipient_public_key: bytes, info: bytes) -> bytes:
    return _SUITE.encrypt(data_key, X25519PublicKey.from_public_bytes(recipient_public_key), info=info)


def open_sealed(sealed: bytes, private_key: X25519PrivateKey, info: bytes) -> bytes:
    return _SUITE.decrypt(sealed, private_key, info=info)


def raw_public_key(private_key: X25519PrivateKey) -> bytes:
    return private_key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
