"""API keys: shown once, stored only as SHA-256 hashes, scoped to a tenant (and optionally models)."""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import json
import secrets
from dataclasses import dataclass
from pathlib import Path

from key_broker.fsutil import atomic_write

KEY_PREFIX = "sk-sealed-"


@dataclass(frozen=True)
class ApiKey:
    key_hash: str
    tenant: str
    name: str
    models: tuple[str, ...] = ()  # empty: every model of the tenant
    expires_at: str | None = None

    def expired(self, now: dt.datetime) -> bool:
        return self.expires_at is not None and now >= dt.datetime.fromisoformat(self.expires_at)


def hash_key(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


class ApiKeyStore:
    def __init__(self, path: Path) -> None:
        self._path = path

    def _load(self) -> dict[str, dict]:
        if not self._path.exists():
            return {}
        return json.loads(self._path.read_text())

    def create(self, tenant: str, name: str, models: tuple[str, ...] = (), expires_at: str | None = None) -> str:
        secret = KEY_PREFIX + secrets.token_urlsafe(32)
        keys = self._load()
        keys[hash_key(secret)] = {"tenant": tenant, "name": name, "models": list(models), "expires_at": expires_at}
        atomic_write(self._path, json.dumps(keys, sort_keys=True, indent=1).encode())
        return secret

    def lookup(self, secret: str) -> ApiKey | None:
        wanted = hash_key(secret)
        for key_hash, doc in self._load().items():
            if hmac.compare_digest(key_hash, wanted):
                return ApiKey(key_hash, doc["tenant"], doc["name"], tuple(doc.get("models", ())), doc.get("expires_at"))
        return None
