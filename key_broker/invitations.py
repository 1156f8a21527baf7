"""Tenant invitations (issue #46): the only way a first policy-admin key is bound to a tenant.

The operator's create-tenant call (or `POST /v1/admin/tenants/<t>/invitations`) makes one: a random
nonce for the tenant, signed with the broker instance's key (protocol/broker/tenancy.py), kept here
(`invitations/<tenant>.json`, through the state ledger) with its expiry and the instance that issued
it. A first registration redeems one: issued here for this tenant, unexpired, never used, naming
this instance; redeemed once. What it cannot decide is whose key answers it: the tenant's CLI checks
that (the attested governing-key answer) before it sends anything.
"""

from __future__ import annotations

import datetime as dt
import json
import secrets
import threading
from pathlib import Path
from typing import Any

from key_broker.errors import KeyBrokerError, PolicyUnsigned
from key_broker.names import check_name
from key_broker.statefile import StateFiles, UnsafePlainFiles

DIRECTORY = "invitations"
DEFAULT_TTL = dt.timedelta(days=7)


class InvitationBook:
    def __init__(self, root: Path, files: StateFiles | None = None) -> None:
        self._root = root
        self._files = files if files is not None else UnsafePlainFiles(root)
        self._lock = threading.Lock()

    def _path(self, tenant: str) -> Path:
        return self._root / DIRECTORY / f"{check_name(tenant, 'tenant')}.json"

    def _load(self, tenant: str) -> dict[str, dict[str, Any]]:
        try:
            raw = self._files.read(self._path(tenant))  # authenticated by the state ledger
            return {} if raw is None else dict(json.loads(raw))
        except (OSError, ValueError, TypeError) as exc:
            raise KeyBrokerError(f"invitations of {tenant} unreadable") from exc

    def issue(self, tenant: str, instance: str, now: dt.datetime,
              ttl: dt.timedelta = DEFAULT_TTL) -> tuple[str, dt.datetime]:
        """A new nonce for ``tenant`` from broker instance ``instance`` (hex), and its expiry."""
        nonce, expires = secrets.token_hex(32), now + ttl
        with self._lock:
            doc = self._load(tenant)
            # Expired or used entries stay a day past expiry (a replay is answered "used", not "unknown").
            doc = {n: e for n, e in doc.items() if dt.datetime.fromisoformat(e["expires"]) > now - dt.timedelta(days=1)}
            doc[nonce] = {"expires": expires.isoformat(), "instance": instance, "used": False}
            self._files.write(self._path(tenant), json.dumps(doc, sort_keys=True).encode())
        return nonce, expires

    def redeem(self, tenant: str, nonce: Any, instance: Any, now: dt.datetime) -> None:
        """Mark ``nonce`` used; PolicyUnsigned (nothing changed) unless it was issued here for ``tenant``
        by ``instance``, has not expired and was never used."""
        with self._lock:
            doc = self._load(tenant)
            entry = doc.get(nonce) if isinstance(nonce, str) else None
            if entry is None:
                raise PolicyUnsigned("the invitation was not issued by this broker for this tenant")
            if entry["used"]:
                raise PolicyUnsigned("the invitation was used already (replayed)")
            if now >= dt.datetime.fromisoformat(entry["expires"]):
                raise PolicyUnsigned("the invitation has expired: the operator issues a new one")
            if instance != entry["instance"]:
                raise PolicyUnsigned("the acceptance names another broker instance")
            entry["used"] = True
            self._files.write(self._path(tenant), json.dumps(doc, sort_keys=True).encode())
