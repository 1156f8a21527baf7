"""Data keys reach the broker only HPKE-sealed to its import key, for exactly one signed package."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from protocol.model_ref import ModelRef

Harness = Any


def _import_pem(kb: Harness) -> str:
    return kb.client.get("/v1/import-key").json()["public_key_pem"]


def _put(kb: Harness, body: dict, version: str = "v1") -> int:
    return kb.as_tenant("acme", "PUT", f"/tenants/acme/models/m/versions/{version}/data-key", json=body).status_code


def test_sealed_key_registers_and_releases(kb: Harness, sealed_upload: Any) -> None:
    doc = kb.client.get("/v1/import-key").json()
    assert doc["import_key_id"].startswith("x25519:") and "PRIVATE" not in doc["public_key_pem"]
    kb.setup_tenant("acme")  # uses the sealed path
    assert kb.obtain("acme").data_key is not None


def _other_key_pem() -> str:
    return X25519PrivateKey.generate().public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode()


def _flip_manifest(body: dict) -> dict:
    raw = bytearray(base64.b64decode(body["manifest"]))
    raw[raw.index(b'"key_id"') + 12] ^= 1
    return {**body, "manifest": base64.b64encode(bytes(raw)).decode()}


NEGATIVES = [
    ("sealed-to-another-broker", lambda kb, up: up(_other_key_pem(), "acme", "m", "v1")[0], 400),
    ("manifest-for-another-version", lambda kb, up: up(_import_pem(kb), "acme", "m", "v2")[0], 400),
    ("manifest-edited-after-signing", lambda kb, up: _flip_manifest(up(_import_pem(kb), "acme", "m", "v1")[0]), 400),
    ("signature-missing", lambda kb, up: {**up(_import_pem(kb), "acme", "m", "v1")[0], "signature_files": {}}, 400),
    ("key-of-another-package", lambda kb, up: {**up(_import_pem(kb), "acme", "m", "v1")[0],
                                               "sealed_key": up(_import_pem(kb), "acme", "m", "v1")[0]["sealed_key"]},
     400),
    ("unexpected-file-name", lambda kb, up: {**up(_import_pem(kb), "acme", "m", "v1")[0],
                                             "signature_files": {"../../etc/passwd": "AA=="}}, 400),
    ("clear-key-old-shape", lambda kb, up: {"data_key": base64.b64encode(b"k" * 32).decode(), "key_id": "k",
                                            "model_digest": "00" * 32}, 422),
]


@pytest.mark.parametrize(("name", "make", "status"), NEGATIVES, ids=[n[0] for n in NEGATIVES])
def test_bad_sealed_uploads_register_nothing(kb: Harness, sealed_upload: Any, name: str, make: Any,
                                             status: int) -> None:
    assert kb.admin("POST", "/tenants/acme/key").status_code == 201
    body = make(kb, sealed_upload)
    response = kb.as_tenant("acme", "PUT", "/tenants/acme/models/m/versions/v1/data-key", json=body)
    assert response.status_code == status, response.text
    assert response.json()["error"]["message"]
    ciphertext = (body.get("sealed_key") or {}).get("sealed", "")
    assert not ciphertext or ciphertext not in json.dumps(response.json())  # errors never echo key material
    assert not kb.service.datakeys.exists(ModelRef("acme", "m", "v1"))


@pytest.mark.parametrize("version", ["V1", "a..b", "-v", "v" * 65])
def test_a_bad_name_in_the_path_is_a_422_and_registers_nothing(kb: Harness, sealed_upload: Any, version: str) -> None:
    # ModelRef accepts "V1" and 65 characters; the broker's own file-name rule does not: the route
    # checks the stricter rule first, so each is the broker's typed refusal, not a 500.
    assert kb.admin("POST", "/tenants/acme/key").status_code == 201
    body = sealed_upload(_import_pem(kb), "acme", "m", "v1")[0]
    response = kb.as_tenant("acme", "PUT", f"/tenants/acme/models/m/versions/{version}/data-key", json=body)
    assert response.status_code == 422, response.text
    assert response.json()["error"]["type"] == "invalid_request"
    assert kb.service.datakeys.records("acme") == []
