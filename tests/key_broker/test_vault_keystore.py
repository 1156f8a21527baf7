"""OpenBao/Vault Transit key store against a real `bao server -dev` (see conftest.bao_server)."""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

import hvac
import pytest

from key_broker.errors import KeyStoreError, TenantKeyRevoked
from key_broker.keystore import DataKeyRegistry, data_key_context
from key_broker.vault import KEY_PREFIX, VaultTransitKeyStore
from protocol.broker.errors import BrokerRefused
from protocol.model_ref import ModelRef


@pytest.fixture()
def store(bao_server: tuple[str, str], tmp_path: Path) -> VaultTransitKeyStore:
    url, token = bao_server
    return VaultTransitKeyStore.connect(url, token, tmp_path / "state")


def test_transit_wraps_and_unwraps_bound_to_context(store: VaultTransitKeyStore) -> None:
    tenant = f"t{secrets.token_hex(4)}"
    store.create_tenant_key(tenant)
    with pytest.raises(KeyStoreError):
        store.create_tenant_key(tenant)
    dek = secrets.token_bytes(32)
    ctx = data_key_context(ModelRef(tenant, "m", "v1"))
    wrapped, version = store.wrap(tenant, ctx, dek)
    assert version == 1 and wrapped.startswith(b"vault:v1:") and dek not in wrapped
    assert store.unwrap(tenant, ctx, wrapped, 1) == dek
    with pytest.raises(KeyStoreError):
        store.unwrap(tenant, data_key_context(ModelRef(tenant, "m", "v2")), wrapped, 1)  # moved to another version


def test_the_kek_never_leaves_vault(store: VaultTransitKeyStore, bao_server: tuple[str, str]) -> None:
    tenant = f"t{secrets.token_hex(4)}"
    store.create_tenant_key(tenant)
    client = hvac.Client(url=bao_server[0], token=bao_server[1])
    info = client.secrets.transit.read_key(KEY_PREFIX + tenant)["data"]
    assert info["exportable"] is False and info["derived"] is True
    with pytest.raises(hvac.exceptions.VaultError):
        client.secrets.transit.export_key(KEY_PREFIX + tenant, key_type="encryption-key")


def test_rotation_rewraps_inside_vault_and_retires_old_versions(
    store: VaultTransitKeyStore, tmp_path: Path
) -> None:
    tenant = f"t{secrets.token_hex(4)}"
    store.create_tenant_key(tenant)
    registry = DataKeyRegistry(tmp_path / "keys", store)
    keys = {v: secrets.token_bytes(32) for v in ("v1", "v2")}
    for v, k in keys.items():
        registry.register(ModelRef(tenant, "m", v), k, f"id-{v}", None, "00" * 32)
    old = registry.get(ModelRef(tenant, "m", "v1"))
    assert store.rotate_tenant_key(tenant) == 2
    assert registry.rewrap_all(tenant) == 2
    store.retire_versions_below(tenant, 2)
    for v, k in keys.items():
        key, record = registry.data_key(ModelRef(tenant, "m", v))
        assert key == k and record.kek_version == 2
    with pytest.raises(KeyStoreError):
        store.unwrap(tenant, data_key_context(ModelRef(tenant, "m", "v1")), old.wrapped, 1)


def test_revocation_stops_wrap_and_unwrap(store: VaultTransitKeyStore) -> None:
    tenant = f"t{secrets.token_hex(4)}"
    store.create_tenant_key(tenant)
    wrapped, _ = store.wrap(tenant, b"ctx", secrets.token_bytes(32))
    store.revoke_tenant_key(tenant)
    assert store.is_revoked(tenant)
    with pytest.raises(TenantKeyRevoked):
        store.unwrap(tenant, b"ctx", wrapped, 1)
    with pytest.raises(TenantKeyRevoked):
        store.rotate_tenant_key(tenant)


def test_unreachable_vault_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(KeyStoreError, match="cannot reach Vault"):
        VaultTransitKeyStore.connect("http://127.0.0.1:9", "x" * 40, tmp_path, timeout=1)


def test_broker_releases_through_vault_end_to_end(harness_factory: Any, bao_server: tuple[str, str]) -> None:
    kb = harness_factory("vault-broker", keystore="vault", vault_url=bao_server[0], vault_token=bao_server[1])
    tenant = f"t{secrets.token_hex(4)}"
    key = kb.setup_tenant(tenant)
    assert kb.obtain(tenant).data_key == key
    assert kb.admin("POST", f"/tenants/{tenant}/key/rotate").json() == {"kek_version": 2, "rewrapped": 1}
    assert kb.obtain(tenant).data_key == key
    kb.admin("POST", f"/tenants/{tenant}/key/revoke")
    with pytest.raises(BrokerRefused):
        kb.obtain(tenant)
