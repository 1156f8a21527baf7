"""Release policies per (tenant, model), optionally per version, stored as the tenant's signed
envelope (policy/release_documents.py) and loaded as typed ReleasePolicy data; a release looks its
policy up by the `ModelRef` it is for. A policy may reference a signed reference-values document by
id; its measurements then join the policy's inline ones (after the document's signature verifies).

A policy takes effect only when the tenant's policy-admin key (key_broker/policy_admin.py) signed
it, with a version above the stored one: checked when it is stored and again whenever it is read
(a file without the tenant's signature decides nothing). No operator credential can write one.

Lookup: the version-specific policy wins; otherwise the model-wide one; otherwise nothing (deny).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from key_broker.errors import KeyStoreError, PolicyUnsigned
from key_broker.names import check_name
from key_broker.policy_admin import PolicyAdminKeys
from key_broker.refvals import ReferenceValues, ReferenceValuesStore
from key_broker.statefile import StateFiles, UnsafePlainFiles
from policy.documents import check_envelope_signature, envelope_parts
from policy.errors import PolicyInvalid
from policy.release import ReleasePolicy
from policy.release_documents import REFERENCE_KEY, RELEASE_DOMAIN, load_admin_public_key
from protocol.model_ref import ModelRef


@dataclass(frozen=True)
class StoredPolicy:
    policy: ReleasePolicy
    reference_values: str | None = None  # id of a signed reference-values document of the tenant
    # The tenant's signed envelope it was read from: handed to the worker with each release, which
    # checks the tenant's signature itself (a broker the operator runs with its own state has none).
    envelope: Mapping[str, Any] | None = dataclasses.field(default=None, compare=False)

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
    def __init__(self, root: Path, files: StateFiles | None = None, admin_keys: PolicyAdminKeys | None = None) -> None:
        self._root = root
        # Policies decide who gets a key: read and written only through the state ledger.
        self._files = files if files is not None else UnsafePlainFiles(root)
        self.admin_keys = admin_keys if admin_keys is not None else PolicyAdminKeys(root, self._files)
        # Parsed, verified policies by content digest: the hot path skips JSON, signature and validation.
        self._cache: dict[Path, tuple[bytes, StoredPolicy]] = {}
        self._lock = threading.Lock()  # the version check and the write are one step

    @property
    def root(self) -> Path:
        return self._root

    def _path(self, tenant: str, model: str, version: str | None = None) -> Path:
        base = self._root / "policies" / check_name(tenant, "tenant")
        if version is None:
            return base / f"{check_name(model, 'model')}.json"
        return base / f"{check_name(model, 'model')}@{check_name(version, 'version')}.json"

    def put(self, envelope: Any) -> StoredPolicy:
        """Store the tenant's signed policy: its signature must verify with the tenant's current
        policy-admin key and its version must be above the stored one (an old policy cannot be
        replayed in). Raises PolicyUnsigned (or PolicyInvalid) and changes nothing otherwise."""
        try:
            payload, key_id = envelope_parts(envelope)
        except PolicyInvalid as exc:
            raise PolicyUnsigned(f"release policy refused: {exc}") from exc
        record = self.admin_keys.require(str(payload["tenant"]))
        if key_id != record.key_id:
            raise PolicyUnsigned("release policy is not signed by the tenant's current policy-admin key")
        try:
            check_envelope_signature(envelope, record.current(), RELEASE_DOMAIN)
        except PolicyInvalid as exc:
            raise PolicyUnsigned(f"release policy refused: {exc}") from exc
        stored = StoredPolicy.from_dict(payload)  # PolicyInvalid: a signed but malformed policy
        p = stored.policy
        path = self._path(p.tenant, p.model, p.model_version)
        with self._lock:
            current = self._version_on_disk(path)
            if current is not None and p.version <= current:
                raise PolicyUnsigned(f"policy version {p.version} is not newer than {current}")
            self._files.write(path, json.dumps(dict(envelope), sort_keys=True).encode())
        return stored

    def stored_version(self, tenant: str, model: str, model_version: str | None = None) -> int | None:
        """The version of the stored policy of this model (or of this model version), signed or not."""
        return self._version_on_disk(self._path(tenant, model, model_version))

    def _version_on_disk(self, path: Path) -> int | None:
        """The version of the stored document, signed or not (so versions only move forward)."""
        try:
            raw = self._files.read(path)
            if raw is None:
                return None
            doc = json.loads(raw)
            payload = doc.get("payload", doc) if isinstance(doc, dict) else {}
            version = payload.get("version") if isinstance(payload, dict) else None
        except (OSError, ValueError) as exc:
            raise KeyStoreError(f"policy file {path.name} unreadable") from exc
        return version if type(version) is int else 0

    def _verified(self, path: Path, doc: Any) -> StoredPolicy:
        """The policy of a stored envelope whose signature verifies with a key the tenant registered."""
        try:
            payload, key_id = envelope_parts(doc)
        except PolicyInvalid as exc:
            raise PolicyUnsigned(f"policy file {path.name} is not signed by the tenant") from exc
        record = self.admin_keys.require(str(payload["tenant"]))
        pem = record.keys.get(key_id)
        if pem is None or payload["tenant"] != path.parent.name:
            raise PolicyUnsigned(f"policy file {path.name} is not signed by the tenant's key")
        try:
            check_envelope_signature(doc, load_admin_public_key(pem), RELEASE_DOMAIN)
        except PolicyInvalid as exc:
            raise PolicyUnsigned(f"policy file {path.name} is not signed by the tenant's key") from exc
        return dataclasses.replace(StoredPolicy.from_dict(payload), envelope=dict(doc))

    def _read(self, path: Path) -> StoredPolicy | None:
        try:
            raw = self._files.read(path)  # authenticated (digest in the state ledger) on every read
            if raw is None:
                return None
            ident = hashlib.sha256(raw).digest()
            cached = self._cache.get(path)
            if cached is not None and cached[0] == ident:
                return cached[1]
            stored = self._verified(path, json.loads(raw))
        except OSError as exc:
            raise KeyStoreError(f"policy file {path.name} unreadable") from exc
        except ValueError as exc:  # PolicyInvalid is not a ValueError; let it propagate
            raise KeyStoreError(f"policy file {path.name} unreadable") from exc
        self._cache[path] = (ident, stored)
        return stored

    def lookup(self, ref: ModelRef) -> StoredPolicy:
        """The policy that decides releases of `ref`: its version's own, else its model's."""
        for path in (self._path(ref.tenant, ref.model, ref.version), self._path(ref.tenant, ref.model)):
            try:
                stored = self._read(path)
            except PolicyUnsigned as exc:  # a file the tenant did not sign decides nothing
                raise KeyStoreError(str(exc)) from exc
            if stored is not None:
                return stored
        raise KeyStoreError(f"no release policy for {ref.tenant}/{ref.model}")

    def get(self, ref: ModelRef) -> ReleasePolicy:
        return self.lookup(ref).policy

    def list(self, tenant: str) -> list[StoredPolicy]:
        """The tenant's policies in effect (a stored file without a valid tenant signature is left out)."""
        base = self._root / "policies" / check_name(tenant, "tenant")
        out = []
        for path in self._files.list(base, ".json"):
            if path.parent != base:
                continue
            try:
                stored = self._read(path)
            except PolicyUnsigned:
                continue
            if stored is not None:
                out.append(stored)
        return out


def resolve(store: PolicyStore, refvals: ReferenceValuesStore, ref: ModelRef
            ) -> tuple[ReleasePolicy, ReferenceValues | None]:
    """The effective policy for `ref` and the verified reference values it joined, if any."""
    stored = store.lookup(ref)
    values = refvals.load(ref.tenant, stored.reference_values) if stored.reference_values else None
    return effective_policy(stored, values), values
