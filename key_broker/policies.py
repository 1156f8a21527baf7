"""Release policies per (tenant, model), optionally per version, stored as JSON and loaded as typed
ReleasePolicy data; a release looks its policy up by the `ModelRef` it is for. A policy may
reference a signed reference-values document by id; its measurements then join the policy's
inline ones (after the document's signature verifies).

Lookup: the version-specific policy wins; otherwise the model-wide one; otherwise nothing (deny).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from key_broker.errors import KeyStoreError
from key_broker.names import check_name
from key_broker.refvals import ReferenceValues, ReferenceValuesStore
from key_broker.statefile import StateFiles, UnsafePlainFiles
from policy.errors import PolicyInvalid
from policy.release import ReleasePolicy
from protocol.model_ref import ModelRef

REFERENCE_KEY = "reference_values"


@dataclass(frozen=True)
class StoredPolicy:
    policy: ReleasePolicy
    reference_values: str | None = None  # id of a signed reference-values document of the tenant

    def to_dict(self) -> dict[str, Any]:
        doc = self.policy.to_dict()
        if self.reference_values is not None:
            doc[REFERENCE_KEY] = self.reference_values
        return doc

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> StoredPolicy:
        if not isinstance(doc, Mapping):
            raise PolicyInvalid("release policy must be a JSON object")
        rest = dict(doc)
        ref = rest.pop(REFERENCE_KEY, None)
        if ref is not None:
            check_name(ref, "reference values id")
        return cls(ReleasePolicy.from_dict(rest), ref)


def effective_policy(stored: StoredPolicy, values: ReferenceValues | None) -> ReleasePolicy:
    """The policy the decision uses: inline measurements plus the verified reference values."""
    if values is None:
        return stored.policy
    return dataclasses.replace(stored.policy,
                               allowed_measurements=stored.policy.allowed_measurements | values.measurements)


class PolicyStore:
    def __init__(self, root: Path, files: StateFiles | None = None) -> None:
        self._root = root
        # Policies decide who gets a key: read and written only through the state ledger.
        self._files = files if files is not None else UnsafePlainFiles(root)
        # Parsed policies by content digest: the hot path skips JSON parsing and validation.
        self._cache: dict[Path, tuple[bytes, StoredPolicy]] = {}

    @property
    def root(self) -> Path:
        return self._root

    def _path(self, tenant: str, model: str, version: str | None = None) -> Path:
        base = self._root / "policies" / check_name(tenant, "tenant")
        if version is None:
            return base / f"{check_name(model, 'model')}.json"
        return base / f"{check_name(model, 'model')}@{check_name(version, 'version')}.json"

    def put(self, policy: ReleasePolicy | StoredPolicy) -> None:
        """Store a policy; versions only move forward, so an old policy cannot be replayed in."""
        stored = policy if isinstance(policy, StoredPolicy) else StoredPolicy(policy)
        p = stored.policy
        path = self._path(p.tenant, p.model, p.model_version)
        current = self._read(path)
        if current is not None and p.version <= current.policy.version:
            raise KeyStoreError(f"policy version {p.version} is not newer than {current.policy.version}")
        self._files.write(path, json.dumps(stored.to_dict(), sort_keys=True).encode())

    def _read(self, path: Path) -> StoredPolicy | None:
        try:
            raw = self._files.read(path)  # authenticated (digest in the state ledger) on every read
            if raw is None:
                return None
            ident = hashlib.sha256(raw).digest()
            cached = self._cache.get(path)
            if cached is not None and cached[0] == ident:
                return cached[1]
            stored = StoredPolicy.from_dict(json.loads(raw))
        except OSError as exc:
            raise KeyStoreError(f"policy file {path.name} unreadable") from exc
        except ValueError as exc:  # PolicyInvalid is not a ValueError; let it propagate
            raise KeyStoreError(f"policy file {path.name} unreadable") from exc
        self._cache[path] = (ident, stored)
        return stored

    def lookup(self, ref: ModelRef) -> StoredPolicy:
        """The policy that decides releases of `ref`: its version's own, else its model's."""
        for path in (self._path(ref.tenant, ref.model, ref.version), self._path(ref.tenant, ref.model)):
            stored = self._read(path)
            if stored is not None:
                return stored
        raise KeyStoreError(f"no release policy for {ref.tenant}/{ref.model}")

    def get(self, ref: ModelRef) -> ReleasePolicy:
        return self.lookup(ref).policy

    def list(self, tenant: str) -> list[StoredPolicy]:
        base = self._root / "policies" / check_name(tenant, "tenant")
        return [s for p in self._files.list(base, ".json") if p.parent == base and (s := self._read(p)) is not None]


def resolve(store: PolicyStore, refvals: ReferenceValuesStore, ref: ModelRef
            ) -> tuple[ReleasePolicy, ReferenceValues | None]:
    """The effective policy for `ref` and the verified reference values it joined, if any."""
    stored = store.lookup(ref)
    values = refvals.load(ref.tenant, stored.reference_values) if stored.reference_values else None
    return effective_policy(stored, values), values
