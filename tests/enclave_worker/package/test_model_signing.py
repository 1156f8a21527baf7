"""OpenSSF model-signing (key method, offline) as the package signature."""

from __future__ import annotations

import base64
import json
import secrets
from pathlib import Path

import pytest
import torch
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from fastapi.testclient import TestClient

from api.cli.upload import upload_package
from api.management.uploads import stored_package_dir
from enclave_worker.package import decrypt_package
from enclave_worker.package.writer import write_package
from protocol.package import PackageSignatureError, read_manifest
from protocol.package.signing import ModelSigningKey, sign_manifest, signer_identity

pytest.importorskip("model_signing")


def _ec_key(path: Path) -> ModelSigningKey:
    key = ec.generate_private_key(ec.SECP256R1())
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    return ModelSigningKey(path)


@pytest.fixture
def signed(tmp_path: Path) -> tuple[Path, bytes, ModelSigningKey]:
    signer = _ec_key(tmp_path / "tenant.pem")
    key = secrets.token_bytes(32)
    write_package(tmp_path / "pkg", metadata={}, tensors=[("w", torch.arange(5000, dtype=torch.float32))],
                  data_key=key, key_id="k", tenant="t1", model="m", version="v1", signing_key=signer,
                  segment_size=4096)
    return tmp_path / "pkg", key, signer


def test_model_signing_round_trip(signed: tuple[Path, bytes, ModelSigningKey]) -> None:
    pkg, key, signer = signed
    identity = signer_identity(signer.public_key())
    assert identity.startswith("ecdsa-secp256r1:")
    assert (pkg / "model.sig").exists() and not (pkg / "manifest.sig").exists()
    bundle = json.loads((pkg / "model.sig").read_text())
    assert bundle["mediaType"].startswith("application/vnd.dev.sigstore.bundle")
    model = decrypt_package(pkg, key, required_signer=identity)
    assert torch.equal(model.tensors["w"], torch.arange(5000, dtype=torch.float32))
    with pytest.raises(PackageSignatureError, match="required signer"):
        decrypt_package(pkg, key, required_signer="ecdsa-secp256r1:" + "0" * 32)


def test_model_signing_tamper(signed: tuple[Path, bytes, ModelSigningKey], tmp_path: Path) -> None:
    pkg, _, _ = signed
    manifest = (pkg / "manifest.json").read_bytes()
    (pkg / "manifest.json").write_bytes(manifest.replace(b'"model":"m"', b'"model":"n"'))
    with pytest.raises(PackageSignatureError):
        read_manifest(pkg)
    (pkg / "manifest.json").write_bytes(manifest)
    read_manifest(pkg)
    # An attacker re-signs with its own key and ships its public key: the manifest's signer differs.
    sign_manifest(pkg, manifest, _ec_key(tmp_path / "attacker.pem"))
    with pytest.raises(PackageSignatureError, match="different signer"):
        read_manifest(pkg)


def test_model_signing_signature_bytes_flipped(signed: tuple[Path, bytes, ModelSigningKey]) -> None:
    pkg, _, _ = signed
    bundle = json.loads((pkg / "model.sig").read_text())
    sig = bytearray(base64.b64decode(bundle["dsseEnvelope"]["signatures"][0]["sig"]))
    sig[-1] ^= 1
    bundle["dsseEnvelope"]["signatures"][0]["sig"] = base64.b64encode(bytes(sig)).decode()
    (pkg / "model.sig").write_text(json.dumps(bundle))
    with pytest.raises(PackageSignatureError):
        read_manifest(pkg)


def test_model_signed_package_uploads(upload_app, signed: tuple[Path, bytes, ModelSigningKey], tmp_path: Path) -> None:
    pkg, key, _ = signed
    app = upload_app(tmp_path / "store", lambda: "t1")
    upload_package(pkg, TestClient(app), chunk_bytes=4096)
    stored = stored_package_dir(tmp_path / "store", "t1", "m", "v1")
    assert decrypt_package(stored, key).manifest.signer.startswith("ecdsa-")
