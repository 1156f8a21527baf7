"""Data keys travel from the tenant to a key broker only HPKE-sealed to the broker's import key."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any as Pkg  # the fixture type lives in conftest.py

import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from enclave_worker.package import decrypt_package
from protocol.package import KeySealError, PackageIntegrityError, read_manifest
from protocol.package.format import TAG_BYTES, ad_prefix, associated_data, nonce_for, segment_key
from protocol.package.keywrap import (
    SealedDataKey,
    load_import_public_key,
    open_data_key,
    public_pem,
    seal_data_key,
)


def test_seal_and_open(pkg: Pkg, tmp_path: Path) -> None:
    broker = X25519PrivateKey.generate()
    (tmp_path / "import.pub").write_bytes(public_pem(broker))
    sealed = seal_data_key(pkg.data_key, pkg.manifest, load_import_public_key(tmp_path / "import.pub"))
    text = sealed.to_json()
    assert pkg.data_key.hex() not in text and pkg.data_key not in text.encode()
    assert open_data_key(SealedDataKey.from_json(text), broker, pkg.manifest) == pkg.data_key


@pytest.mark.parametrize("field", ["tenant", "model", "version", "key_id", "package_id"])
def test_sealed_key_is_bound_to_its_package(pkg: Pkg, field: str) -> None:
    broker = X25519PrivateKey.generate()
    sealed = seal_data_key(pkg.data_key, pkg.manifest, broker.public_key())
    moved = dataclasses.replace(sealed, **{field: "other"})
    with pytest.raises(KeySealError):
        open_data_key(moved, broker)


def test_sealed_key_tampered_or_for_another_broker(pkg: Pkg) -> None:
    broker = X25519PrivateKey.generate()
    sealed = seal_data_key(pkg.data_key, pkg.manifest, broker.public_key())
    raw = bytearray(json.loads(sealed.to_json())["sealed"].encode())
    raw[10] = ord("A") if raw[10] != ord("A") else ord("B")
    with pytest.raises(KeySealError):
        open_data_key(dataclasses.replace(sealed, sealed=raw.decode()), broker)
    with pytest.raises(KeySealError, match="another import key"):
        open_data_key(sealed, X25519PrivateKey.generate())


def test_sealed_key_must_be_the_committed_key(pkg: Pkg, make_pkg) -> None:  # type: ignore[no-untyped-def]
    other = make_pkg(pkg.path.parent / "other", seed=2)
    broker = X25519PrivateKey.generate()
    # The right names but another package's key: the manifest's key commitment refuses it.
    sealed = seal_data_key(other.data_key, pkg.manifest, broker.public_key())
    with pytest.raises(KeySealError, match="commits to"):
        open_data_key(sealed, broker, pkg.manifest)


def test_key_holder_cannot_substitute_weights(pkg: Pkg) -> None:
    """Someone holding the data key (not the signer) re-encrypts segment 0 with other plaintext:
    every GCM tag verifies, but the signed plaintext digest does not, so nothing is served."""
    manifest, raw, _ = read_manifest(pkg.path)
    model = decrypt_package(pkg.path, pkg.data_key)
    n = manifest.segment_len(0)
    forged_plain = bytearray(model.buffer[:n].numpy().tobytes())
    forged_plain[-1] ^= 0xFF
    aead = AESGCM(segment_key(pkg.data_key, manifest.package_id))
    last = manifest.num_segments == 1
    forged = aead.encrypt(nonce_for(0, last), bytes(forged_plain),
                          associated_data(ad_prefix(manifest.package_id, raw), 0, last))
    payload = bytearray((pkg.path / "payload.bin").read_bytes())
    payload[: n + TAG_BYTES] = forged
    (pkg.path / "payload.bin").write_bytes(bytes(payload))
    with pytest.raises(PackageIntegrityError, match="digest differs"):
        decrypt_package(pkg.path, pkg.data_key)
