"""Admin API credentials: the operator's admin token and per-tenant tenant-admin tokens.

Only SHA-256 hashes are stored (tokens are 256-bit random, so a plain hash is enough: there is
nothing to brute-force). The operator token comes from settings (a hash, or the env var hashed at
startup); tenant-admin tokens are issued by the operator and kept, hashed, in a 0600 file.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import json
import secrets
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from key_broker.errors import AuthError, KeyBrokerError, SettingsError
from key_broker.names import check_name
from key_broker.statefile import StateFiles, UnsafePlainFiles

TOKEN_PREFIX = "skb_"
_PLACEHOLDERS = frozenset({"", "changeme", "change-me", "admin", "password", "secret", "token", "dev", "test",
                           "example", "placeholder", "sealed", "root"})
MIN_SECRET_CHARS = 32

Role = Literal["admin", "tenant-admin"]


def hash_token(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def is_placeholder_secret(secret: str) -> bool:
    s = secret.strip().lower()
    return s in _PLACEHOLDERS or len(s) < MIN_SECRET_CHARS or len(set(s)) <= 4 or "changeme" in s


def check_secret(secret: str, what: str, *, dev: bool) -> None:
    """Outside dev mode, a guessable or example secret is a configuration error, not a warning."""
    if is_placeholder_secret(secret) and not dev:
        raise SettingsError(f"{what} looks like a placeholder; use >= {MIN_SECRET_CHARS} random chars")


@dataclass(frozen=True)
class Principal:
    role: Role
    tenant: str | None  # None for the operator admin
    token_id: str

    def may_manage(self, tenant: str) -> bool:
        return self.role == "admin" or self.tenant == tenant


class AdminTokenStore:
    def __init__(self, path: Path, operator_hashes: frozenset[str] = frozenset(),
                 files: StateFiles | None = None) -> None:
        self._path = path
        self._operator = operator_hashes
        self._lock = threading.Lock()
        # A planted token hash would make anyone a tenant admin: read through the state ledger.
        self._files = files if files is not None else UnsafePlainFiles(path.parent)

    def _load(self) -> dict[str, dict[str, Any]]:
        try:
            raw = self._files.read(self._path)
            doc: dict[str, dict[str, Any]] = {} if raw is None else json.loads(raw)
            return doc
        except (OSError, ValueError) as exc:
            raise KeyBrokerError("admin token file unreadable") from exc

    def issue_tenant_token(self, tenant: str, now: dt.datetime) -> tuple[str, str]:
        """A new tenant-admin token; the secret is returned once and only its hash is stored."""
        check_name(tenant, "tenant")
        token_id, secret = secrets.token_hex(8), TOKEN_PREFIX + secrets.token_urlsafe(32)
        with self._lock:
            doc = self._load()
            doc[token_id] = {"sha256": hash_token(secret), "role": "tenant-admin", "tenant": tenant,
                             "created": now.isoformat(), "revoked": False}
            self._files.write(self._path, json.dumps(doc, sort_keys=True).encode())
        return token_id, secret

    def revoke(self, token_id: str) -> None:
        with self._lock:
            doc = self._load()
            if token_id not in doc:
                raise AuthError("unknown token id")
            doc[token_id]["revoked"] = True
            self._files.write(self._path, json.dumps(doc, sort_keys=True).encode())

    def authenticate(self, secret: str) -> Principal:
        digest = hash_token(secret)
        for op in self._operator:
            if hmac.compare_digest(op, digest):
                return Principal("admin", None, "operator")
        for token_id, entry in self._load().items():
            if hmac.compare_digest(entry["sha256"], digest) and not entry.get("revoked"):
                return Principal("tenant-admin", entry["tenant"], token_id)
        raise AuthError("unknown or revoked admin token")
