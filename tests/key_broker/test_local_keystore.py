"""The default local key store: KEKs encrypted at rest under the master key, 0600 files, crash-safe
writes."""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path

import pytest

from key_broker.errors import KeyStoreError, TenantKeyRevoked
from key_broker.keystore import DataKeyRegistry, LocalKeyStore
from protocol.fsutil import atomic_write
from protocol.model_ref import ModelRef


def test_keks_are_encrypted_at_rest_and_files_are_private(tmp_path: Path) -> None:
    master = secrets.token_bytes(32)
    store = LocalKeyStore(tmp_path / "ks", master)
    store.create_tenant_key("acme")
    registry = DataKeyRegistry(tmp_path / "ks", store)
    dek = secrets.token_bytes(32)
    registry.register(ModelRef("acme", "m", "v1"), dek, "k1", None, "00" * 32)
    for path in (tmp_path / "ks").rglob("*"):
        if path.is_file():
            assert path.stat().st_mode & 0o777 == 0o600
            raw = path.read_bytes()
            assert dek not in raw and dek.hex().encode() not in raw
    with pytest.raises(KeyStoreError):  # another master key cannot open the KEK
        DataKeyRegistry(tmp_path / "ks", LocalKeyStore(tmp_path / "ks", secrets.token_bytes(32))).data_key(
            ModelRef("acme", "m", "v1")
        )
    assert registry.data_key(ModelRef("acme", "m", "v1"))[0] == dek


def test_atomic_write_leaves_the_old_file_when_the_write_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "f.json"
    atomic_write(path, b"old")

    def boom(*_: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError):
        atomic_write(path, b"new")
    assert path.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["f.json"]  # no temp file left behind


def test_rotation_interrupted_before_retirement_keeps_every_key_readable(tmp_path: Path) -> None:
    store = LocalKeyStore(tmp_path / "ks", secrets.token_bytes(32))
    store.create_tenant_key("acme")
    registry = DataKeyRegistry(tmp_path / "ks", store)
    keys = {v: secrets.token_bytes(32) for v in ("v1", "v2")}
    for v, k in keys.items():
        registry.register(ModelRef("acme", "m", v), k, v, None, "00" * 32)
    store.rotate_tenant_key("acme")  # crash here: nothing re-wrapped yet
    assert all(registry.data_key(ModelRef("acme", "m", v))[0] == k for v, k in keys.items())
    assert registry.rewrap_all("acme") == 2
    store.retire_versions_below("acme", 2)
    kek = json.loads((tmp_path / "ks" / "tenants" / "acme" / "kek.json").read_text())
    assert kek["current"] == 2 and set(kek["versions"]) == {"2"}
    assert all(registry.data_key(ModelRef("acme", "m", v))[0] == k for v, k in keys.items())
    store.revoke_tenant_key("acme")
    with pytest.raises(TenantKeyRevoked):
        registry.data_key(ModelRef("acme", "m", "v1"))
