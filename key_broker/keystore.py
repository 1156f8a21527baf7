"""Key stores: tenant key-encryption keys (KEKs) that wrap per-model-version data keys.

LocalKeyStore (the default) keeps each tenant's KEK encrypted under a master key, in 0600 files
written atomically. Data keys are stored only wrapped; the context (tenant, model, version) is the
AEAD's associated data, so a wrapped key cannot be moved to another model.
"""

from __future__ import annotations

import base64
import json
import secrets
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from key_broker.errors import KeyStoreError, TenantKeyRevoked
from key_broker.names import check_name
from key_broker.statefile import StateFiles, UnsafePlainFiles
from protocol.model_ref import ModelRef


@dataclass(frozen=True)
class DataKeyRecord:
    tenant: str
    model: str
    version: str
    key_id: str
    wrapped: bytes
    kek_version: int
    signer: str | None
    model_digest: str  # the signed plaintext digest of the package this key decrypts

    @property
    def ref(self) -> ModelRef:
        return ModelRef(self.tenant, self.model, self.version)


class KeyStore(Protocol):
    """Tenant key-encryption keys. Implementations: LocalKeyStore, vault.VaultTransitKeyStore."""

    def create_tenant_key(self, tenant: str) -> None: ...
    def has_tenant_key(self, tenant: str) -> bool: ...
    def wrap(self, tenant: str, context: bytes, data_key: bytes) -> tuple[bytes, int]: ...
    def unwrap(self, tenant: str, context: bytes, wrapped: bytes, kek_version: int) -> bytes: ...
    def rewrap(self, tenant: str, context: bytes, wrapped: bytes, kek_version: int) -> tuple[bytes, int]: ...
    def rotate_tenant_key(self, tenant: str) -> int: ...
    def retire_versions_below(self, tenant: str, version: int) -> None: ...
    def revoke_tenant_key(self, tenant: str) -> None: ...
    def is_revoked(self, tenant: str) -> bool: ...


def data_key_context(ref: ModelRef) -> bytes:
    return f"sealed-dek-v1|{ref.tenant}|{ref.model}|{ref.version}".encode()


class LocalKeyStore:
    def __init__(self, root: Path, master_key: bytes, files: StateFiles | None = None) -> None:
        self._root = root
        # The key file holds the revocation flag and KEK versions: read and written through the
        # state ledger, so an edited ("revoked": false) or rolled-back file is refused.
        self._files = files if files is not None else UnsafePlainFiles(root)
        self._master = AESGCM(master_key)
        # Read-modify-write of a tenant's key file (rotate, retire, revoke) must not interleave.
        self._lock = threading.RLock()

    def _kek_path(self, tenant: str) -> Path:
        return self._root / "tenants" / check_name(tenant, "tenant") / "kek.json"

    def _load(self, tenant: str) -> dict[str, Any]:
        try:
            raw = self._files.read(self._kek_path(tenant))
            if raw is None:
                raise KeyStoreError(f"no key for tenant {tenant}")
            doc = json.loads(raw)
            if not isinstance(doc, dict) or not isinstance(doc.get("revoked"), bool):
                raise ValueError("malformed tenant key file")
            return doc
        except OSError as exc:
            raise KeyStoreError(f"tenant key file unreadable: {type(exc).__name__}") from exc
        except ValueError as exc:
            raise KeyStoreError("tenant key file unreadable") from exc

    def _save(self, tenant: str, doc: dict[str, Any]) -> None:
        self._files.write(self._kek_path(tenant), json.dumps(doc, sort_keys=True).encode())

    def _seal_kek(self, tenant: str, version: int, kek: bytes) -> str:
        nonce = secrets.token_bytes(12)
        ct = self._master.encrypt(nonce, kek, f"kek|{tenant}|{version}".encode())
        return base64.b64encode(nonce + ct).decode()

    def _kek(self, tenant: str, doc: dict[str, Any], version: int) -> bytes:
        try:
            blob = base64.b64decode(doc["versions"][str(version)])
            return self._master.decrypt(blob[:12], blob[12:], f"kek|{tenant}|{version}".encode())
        except (KeyError, ValueError, InvalidTag) as exc:
            raise KeyStoreError(f"tenant key version {version} unavailable") from exc

    def create_tenant_key(self, tenant: str) -> None:
        with self._lock:
            if self._files.exists(self._kek_path(tenant)):
                raise KeyStoreError(f"tenant {tenant} already has a key")
            self._save(tenant, {"current": 1, "revoked": False,
                                "versions": {"1": self._seal_kek(tenant, 1, secrets.token_bytes(32))}})

    def has_tenant_key(self, tenant: str) -> bool:
        return self._files.exists(self._kek_path(tenant))

    def wrap(self, tenant: str, context: bytes, data_key: bytes) -> tuple[bytes, int]:
        doc = self._load(tenant)
        if doc["revoked"]:
            raise TenantKeyRevoked(f"tenant {tenant} key is revoked")
        version = int(doc["current"])
        nonce = secrets.token_bytes(12)
        return nonce + AESGCM(self._kek(tenant, doc, version)).encrypt(nonce, data_key, context), version

    def unwrap(self, tenant: str, context: bytes, wrapped: bytes, kek_version: int) -> bytes:
        doc = self._load(tenant)
        if doc["revoked"]:
            raise TenantKeyRevoked(f"tenant {tenant} key is revoked")
        try:
            return AESGCM(self._kek(tenant, doc, kek_version)).decrypt(wrapped[:12], wrapped[12:], context)
        except InvalidTag as exc:
            raise KeyStoreError("wrapped data key does not authenticate in this context") from exc

    def rewrap(self, tenant: str, context: bytes, wrapped: bytes, kek_version: int) -> tuple[bytes, int]:
        return self.wrap(tenant, context, self.unwrap(tenant, context, wrapped, kek_version))

    def rotate_tenant_key(self, tenant: str) -> int:
        with self._lock:
            doc = self._load(tenant)
            if doc["revoked"]:
                raise TenantKeyRevoked(f"tenant {tenant} key is revoked")
            version = int(doc["current"]) + 1
            doc["versions"][str(version)] = self._seal_kek(tenant, version, secrets.token_bytes(32))
            doc["current"] = version
            self._save(tenant, doc)
            return version

    def retire_versions_below(self, tenant: str, version: int) -> None:
        with self._lock:
            doc = self._load(tenant)
            doc["versions"] = {v: blob for v, blob in doc["versions"].items() if int(v) >= version}
            self._save(tenant, doc)

    def revoke_tenant_key(self, tenant: str) -> None:
        with self._lock:
            doc = self._load(tenant)
            doc["revoked"] = True
            self._save(tenant, doc)

    def is_revoked(self, tenant: str) -> bool:
        return bool(self._load(tenant)["revoked"])


class DataKeyRegistry:
    """Wrapped data keys per (tenant, model, version), one 0600 JSON file each."""

    def __init__(self, root: Path, keystore: KeyStore, files: StateFiles | None = None) -> None:
        self._root = root
        self._keystore = keystore
        # signer and model_digest decide what may be released: authenticated by the state ledger.
        self._files = files if files is not None else UnsafePlainFiles(root)

    def _path(self, ref: ModelRef) -> Path:
        return (self._root / "datakeys" / check_name(ref.tenant, "tenant") / check_name(ref.model, "model")
                / f"{check_name(ref.version, 'version')}.json")

    def register(self, ref: ModelRef, data_key: bytes, key_id: str, signer: str | None,
                 model_digest: str) -> DataKeyRecord:
        wrapped, kek_version = self._keystore.wrap(ref.tenant, data_key_context(ref), data_key)
        record = DataKeyRecord(ref.tenant, ref.model, ref.version, key_id, wrapped, kek_version, signer,
                               model_digest)
        self._write(record)
        return record

    def _write(self, r: DataKeyRecord) -> None:
        doc = {"key_id": r.key_id, "wrapped": base64.b64encode(r.wrapped).decode(),
               "kek_version": r.kek_version, "signer": r.signer, "model_digest": r.model_digest}
        self._files.write(self._path(r.ref), json.dumps(doc, sort_keys=True).encode())

    def get(self, ref: ModelRef) -> DataKeyRecord:
        try:
            raw = self._files.read(self._path(ref))
            if raw is None:
                raise KeyStoreError(f"no data key for {ref}")
            doc = json.loads(raw)
            return DataKeyRecord(ref.tenant, ref.model, ref.version, doc["key_id"], base64.b64decode(doc["wrapped"]),
                                 int(doc["kek_version"]), doc.get("signer"), str(doc["model_digest"]))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise KeyStoreError(f"data key file for {ref} unreadable") from exc

    def data_key(self, ref: ModelRef) -> tuple[bytes, DataKeyRecord]:
        record = self.get(ref)
        key = self._keystore.unwrap(ref.tenant, data_key_context(ref), record.wrapped,
                                    record.kek_version)
        return key, record

    def records(self, tenant: str) -> list[DataKeyRecord]:
        base = self._root / "datakeys" / check_name(tenant, "tenant")
        return [self.get(ModelRef(tenant, p.parent.name, p.stem)) for p in self._files.list(base, ".json")
                if p.parent.parent == base]

    def exists(self, ref: ModelRef) -> bool:
        return self._files.exists(self._path(ref))

    def rewrap_all(self, tenant: str) -> int:
        """After a rotation: re-wrap every data key of the tenant under the current KEK version.
        Each file is replaced atomically, and old KEK versions stay until every key is re-wrapped,
        so a crash half-way leaves every data key readable; rerunning finishes the job."""
        count = 0
        for r in self.records(tenant):
            wrapped, kek_version = self._keystore.rewrap(tenant, data_key_context(r.ref),
                                                         r.wrapped, r.kek_version)
            self._write(DataKeyRecord(tenant, r.model, r.version, r.key_id, wrapped, kek_version, r.signer,
                                      r.model_digest))
            count += 1
        return count
