"""OpenBao/Vault Transit key store (through hvac): one transit key per tenant wraps data keys.

The key-encryption key never leaves Vault: wrap, unwrap and rewrap are Transit operations. Keys
are created `derived`, and the data-key context (tenant, model, version) is the derivation
context, so a ciphertext moved to another model does not decrypt. Revocation is the broker's own
decision (no new releases), kept as a 0600 flag file beside the broker's other state, because
Transit has no "disabled" state short of deleting the key (which would destroy every data key).
"""

from __future__ import annotations

import base64
import re
from pathlib import Path
from typing import Any

import hvac
import hvac.exceptions
import requests

from key_broker.errors import KeyStoreError, TenantKeyRevoked
from key_broker.names import check_name
from key_broker.statefile import StateFiles, UnsafePlainFiles

_CIPHERTEXT = re.compile(r"^vault:v(\d+):")
KEY_PREFIX = "sealed-tenant-"


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


class VaultTransitKeyStore:
    def __init__(self, client: hvac.Client, state_dir: Path, mount_point: str = "transit",
                 files: StateFiles | None = None) -> None:
        self._client = client
        self._transit = client.secrets.transit
        self._mount = mount_point
        self._state = state_dir
        # Revocation flags go through the state ledger: a deleted flag is refused, not "active".
        self._files = files if files is not None else UnsafePlainFiles(state_dir)

    @property
    def client(self) -> hvac.Client:
        return self._client

    @classmethod
    def connect(cls, url: str, token: str, state_dir: Path, mount_point: str = "transit",
                timeout: float = 10.0, files: StateFiles | None = None) -> VaultTransitKeyStore:
        client = hvac.Client(url=url, token=token, timeout=timeout)
        try:
            authenticated = client.is_authenticated()
        except (hvac.exceptions.VaultError, requests.RequestException) as exc:
            raise KeyStoreError(f"cannot reach Vault at {url}: {type(exc).__name__}") from exc
        if not authenticated:
            raise KeyStoreError("Vault token is not valid")
        return cls(client, state_dir, mount_point, files)

    def _name(self, tenant: str) -> str:
        return KEY_PREFIX + check_name(tenant, "tenant")

    def _call(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
        # Vault errors can quote request data; never pass their text on (it may echo a ciphertext).
        try:
            return fn(*args, mount_point=self._mount, **kwargs) or {}
        except hvac.exceptions.InvalidPath as exc:
            raise KeyStoreError(f"Vault transit {what}: no such key") from exc
        except (hvac.exceptions.VaultError, requests.RequestException) as exc:
            raise KeyStoreError(f"Vault transit {what} failed ({type(exc).__name__})") from exc

    def _revoked_flag(self, tenant: str) -> Path:
        return self._state / "revoked" / check_name(tenant, "tenant")

    def _check_active(self, tenant: str) -> None:
        if self.is_revoked(tenant):
            raise TenantKeyRevoked(f"tenant {tenant} key is revoked")

    def create_tenant_key(self, tenant: str) -> None:
        if self.has_tenant_key(tenant):
            raise KeyStoreError(f"tenant {tenant} already has a key")
        self._call("create", self._transit.create_key, self._name(tenant), derived=True,
                   key_type="aes256-gcm96", exportable=False)

    def has_tenant_key(self, tenant: str) -> bool:
        try:
            self._call("read", self._transit.read_key, self._name(tenant))
        except KeyStoreError:
            return False
        return True

    def current_version(self, tenant: str) -> int:
        data = self._call("read", self._transit.read_key, self._name(tenant))["data"]
        return int(data["latest_version"])

    @staticmethod
    def _version_of(ciphertext: str) -> int:
        match = _CIPHERTEXT.match(ciphertext)
        if match is None:
            raise KeyStoreError("Vault returned an unexpected ciphertext format")
        return int(match.group(1))

    def wrap(self, tenant: str, context: bytes, data_key: bytes) -> tuple[bytes, int]:
        self._check_active(tenant)
        ct = self._call("encrypt", self._transit.encrypt_data, self._name(tenant), plaintext=_b64(data_key),
                        context=_b64(context))["data"]["ciphertext"]
        return ct.encode(), self._version_of(ct)

    def unwrap(self, tenant: str, context: bytes, wrapped: bytes, kek_version: int) -> bytes:
        self._check_active(tenant)
        ct = wrapped.decode("ascii", errors="replace")
        if self._version_of(ct) != kek_version:
            raise KeyStoreError("wrapped data key does not match its recorded key version")
        plaintext = self._call("decrypt", self._transit.decrypt_data, self._name(tenant), ciphertext=ct,
                               context=_b64(context))["data"]["plaintext"]
        return base64.b64decode(plaintext)

    def rewrap(self, tenant: str, context: bytes, wrapped: bytes, kek_version: int) -> tuple[bytes, int]:
        # Transit re-encrypts inside Vault: the data key is never returned to the broker here.
        self._check_active(tenant)
        ct = self._call("rewrap", self._transit.rewrap_data, self._name(tenant),
                        ciphertext=wrapped.decode("ascii", errors="replace"),
                        context=_b64(context))["data"]["ciphertext"]
        return ct.encode(), self._version_of(ct)

    def rotate_tenant_key(self, tenant: str) -> int:
        self._check_active(tenant)
        self._call("rotate", self._transit.rotate_key, self._name(tenant))
        return self.current_version(tenant)

    def retire_versions_below(self, tenant: str, version: int) -> None:
        self._call("configure", self._transit.update_key_configuration, self._name(tenant),
                   min_decryption_version=version)

    def revoke_tenant_key(self, tenant: str) -> None:
        if not self.has_tenant_key(tenant):
            raise KeyStoreError(f"no key for tenant {tenant}")
        self._files.write(self._revoked_flag(tenant), b"revoked\n")

    def is_revoked(self, tenant: str) -> bool:
        return self._files.read(self._revoked_flag(tenant)) is not None
