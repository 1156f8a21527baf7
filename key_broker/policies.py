"""Release policies per (tenant, model), stored as JSON and loaded as typed ReleasePolicy data."""

from __future__ import annotations

import json
from pathlib import Path

from key_broker.errors import KeyStoreError
from key_broker.fsutil import atomic_write
from key_broker.names import check_name
from policy.release import ReleasePolicy


class PolicyStore:
    def __init__(self, root: Path) -> None:
        self._root = root

    def _path(self, tenant: str, model: str) -> Path:
        return self._root / "policies" / check_name(tenant, "tenant") / f"{check_name(model, 'model')}.json"

    def put(self, policy: ReleasePolicy) -> None:
        """Store a policy; versions only move forward, so an old policy cannot be replayed in."""
        try:
            current = self.get(policy.tenant, policy.model)
        except KeyStoreError:
            current = None
        if current is not None and policy.version <= current.version:
            raise KeyStoreError(f"policy version {policy.version} is not newer than {current.version}")
        atomic_write(self._path(policy.tenant, policy.model), json.dumps(policy.to_dict(), sort_keys=True).encode())

    def get(self, tenant: str, model: str) -> ReleasePolicy:
        try:
            return ReleasePolicy.from_dict(json.loads(self._path(tenant, model).read_text()))
        except FileNotFoundError as exc:
            raise KeyStoreError(f"no release policy for {tenant}/{model}") from exc
