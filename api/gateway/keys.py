"""Bootstrap API keys: `sealed up` writes the demo key's hash before the gateway's database exists;
the gateway imports the hashes at start (`GatewayService`), and from then on the store owns keys.
The demo tenant's signed policy set (with its caller list) comes the same way (BOOTSTRAP_POLICIES)."""

from __future__ import annotations

import json
import secrets
from pathlib import Path

from api.store.repo import KEY_PREFIX, hash_secret
from protocol.fsutil import atomic_write

BOOTSTRAP_POLICIES = "tenant-policies.json"  # tenant -> {"document": signed envelope, "admin_key_pem": PEM}


def write_bootstrap_policy(path: Path, tenant: str, document: dict, admin_key_pem: str) -> None:
    policies = json.loads(path.read_text()) if path.exists() else {}
    policies[tenant] = {"document": document, "admin_key_pem": admin_key_pem}
    atomic_write(path, json.dumps(policies, sort_keys=True, indent=1).encode())


class ApiKeyStore:
    """The bootstrap file: secret hash -> tenant, name, models, expiry. Secrets are never stored."""

    def __init__(self, path: Path) -> None:
        self._path = path

    def create(self, tenant: str, name: str, models: tuple[str, ...] = (), expires_at: str | None = None) -> str:
        secret = KEY_PREFIX + secrets.token_urlsafe(32)
        keys = json.loads(self._path.read_text()) if self._path.exists() else {}
        keys[hash_secret(secret)] = {"tenant": tenant, "name": name, "models": list(models),
                                     "expires_at": expires_at}
        atomic_write(self._path, json.dumps(keys, sort_keys=True, indent=1).encode())
        return secret
