"""Bootstrap files: what `sealed up` writes before the control plane's database exists (the demo API
key's hash in `api-keys.json`, the demo tenant's signed policy set with its caller list in
`tenant-policies.json`), and their import into the store when the gateway starts (and again when
a key is not found). From then on the store owns them. Secrets are never written, only their
hashes; a policy set is stored only if it verifies with the admin key written beside it."""

from __future__ import annotations

import datetime as dt
import json
import secrets
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from api.store.repo import KEY_PREFIX, Store, hash_secret
from policy.documents import verify_policy_document
from protocol.fsutil import atomic_write

KEYS_FILE = "api-keys.json"  # secret hash -> tenant, name, models, expiry
BOOTSTRAP_POLICIES = "tenant-policies.json"  # tenant -> {"document": signed envelope, "admin_key_pem": PEM}


def write_bootstrap_policy(path: Path, tenant: str, document: dict, admin_key_pem: str) -> None:
    policies = json.loads(path.read_text()) if path.exists() else {}
    policies[tenant] = {"document": document, "admin_key_pem": admin_key_pem}
    atomic_write(path, json.dumps(policies, sort_keys=True, indent=1).encode())


class ApiKeyStore:
    """The bootstrap key file (`KEYS_FILE`)."""

    def __init__(self, path: Path) -> None:
        self._path = path

    def create(self, tenant: str, name: str, models: tuple[str, ...] = (), expires_at: str | None = None) -> str:
        secret = KEY_PREFIX + secrets.token_urlsafe(32)
        keys = json.loads(self._path.read_text()) if self._path.exists() else {}
        keys[hash_secret(secret)] = {"tenant": tenant, "name": name, "models": list(models),
                                     "expires_at": expires_at}
        atomic_write(self._path, json.dumps(keys, sort_keys=True, indent=1).encode())
        return secret


def import_bootstrap(store: Store, data_dir: Path) -> None:
    """Store the bootstrap files' key hashes, and each policy set the store does not hold as written."""
    policies = data_dir / BOOTSTRAP_POLICIES
    for tenant, entry in (json.loads(policies.read_text()) if policies.exists() else {}).items():
        row = store.policy(tenant)
        if row is not None and row.document == entry["document"]:
            continue
        key = serialization.load_pem_public_key(entry["admin_key_pem"].encode())
        if not isinstance(key, Ed25519PublicKey):
            continue
        verify_policy_document(entry["document"], {tenant: {str(entry["document"].get("key_id")): key}})
        store.ensure_tenant(tenant)
        store.put_policy(tenant, entry["document"], entry["admin_key_pem"])
    keys = data_dir / KEYS_FILE
    for key_hash, doc in (json.loads(keys.read_text()) if keys.exists() else {}).items():
        expires = dt.datetime.fromisoformat(doc["expires_at"]) if doc.get("expires_at") else None
        store.import_key_hash(key_hash, doc["tenant"], doc["name"], tuple(doc.get("models", ())), expires)
