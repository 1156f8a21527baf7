"""Tenant operations behind the admin API and `sealed keys`: tenant keys (create, rotate with
re-wrap of every data key, revoke), data keys, release policies, reference values, receipts.
Each operation is audited with the acting principal; none logs key material."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from key_broker.auth import AdminTokenStore, Principal
from key_broker.errors import KeyStoreError
from key_broker.keystore import DataKeyRegistry, KeyStore
from key_broker.names import check_name
from key_broker.policies import PolicyStore, StoredPolicy
from key_broker.receipts import ReceiptBook
from key_broker.refvals import ReferenceValues, ReferenceValuesStore
from policy.audit import AuditLog


class Conflict(KeyStoreError):
    """The resource exists already (a data key is never silently replaced)."""


@dataclass(frozen=True)
class RotationResult:
    kek_version: int
    rewrapped: int


class TenantAdmin:
    def __init__(self, *, keystore: KeyStore, datakeys: DataKeyRegistry, policies: PolicyStore,
                 refvals: ReferenceValuesStore, receipts: ReceiptBook, tokens: AdminTokenStore,
                 audit: AuditLog, clock: Callable[[], dt.datetime]) -> None:
        self.keystore = keystore
        self.datakeys = datakeys
        self.policies = policies
        self.refvals = refvals
        self.receipts = receipts
        self.tokens = tokens
        self._audit = audit
        self._clock = clock

    def _log(self, who: Principal, tenant: str, action: str, **meta: Any) -> None:
        self._audit.append(tenant=tenant, action=action, decision="allow", reason="admin",
                           metadata={"principal": who.token_id, "role": who.role, **meta})

    def create_tenant_key(self, who: Principal, tenant: str) -> None:
        check_name(tenant, "tenant")
        if self.keystore.has_tenant_key(tenant):
            raise Conflict(f"tenant {tenant} already has a key")
        self.keystore.create_tenant_key(tenant)
        self._log(who, tenant, "tenant-key-create")

    def rotate(self, who: Principal, tenant: str) -> RotationResult:
        """New KEK version, every data key re-wrapped under it, then older versions retired. A
        crash before the retirement leaves every key readable; rotating again completes it."""
        version = self.keystore.rotate_tenant_key(tenant)
        count = self.datakeys.rewrap_all(tenant)
        self.keystore.retire_versions_below(tenant, version)
        self._log(who, tenant, "tenant-key-rotate", kek_version=version, rewrapped=count)
        return RotationResult(version, count)

    def revoke(self, who: Principal, tenant: str) -> None:
        self.keystore.revoke_tenant_key(tenant)
        self._log(who, tenant, "tenant-key-revoke")

    def status(self, tenant: str) -> dict[str, Any]:
        has_key = self.keystore.has_tenant_key(check_name(tenant, "tenant"))
        return {"tenant": tenant, "has_key": has_key, "revoked": has_key and self.keystore.is_revoked(tenant),
                "data_keys": [{"model": r.model, "version": r.version, "key_id": r.key_id,
                               "kek_version": r.kek_version, "model_digest": r.model_digest}
                              for r in (self.datakeys.records(tenant) if has_key else [])]}

    def put_data_key(self, who: Principal, tenant: str, model: str, version: str, data_key: bytes,
                     key_id: str, signer: str | None, model_digest: str) -> None:
        if len(data_key) != 32:
            raise KeyStoreError("a data key is 32 bytes")
        if self.datakeys.exists(tenant, model, version):
            raise Conflict(f"{tenant}/{model}/{version} already has a data key; publish a new version")
        self.datakeys.register(tenant, model, version, data_key, key_id, signer, model_digest)
        self._log(who, tenant, "data-key-register", model=model, version=version, key_id=key_id[:64])

    def put_policy(self, who: Principal, tenant: str, doc: dict[str, Any]) -> StoredPolicy:
        stored = StoredPolicy.from_dict(doc)
        if stored.policy.tenant != tenant:
            raise KeyStoreError("the policy names another tenant")
        if stored.reference_values is not None:
            self.refvals.load(tenant, stored.reference_values)  # must exist and verify now
        self.policies.put(stored)
        self._log(who, tenant, "policy-put", policy_id=stored.policy.policy_id[:64],
                  policy_version=stored.policy.version, model=stored.policy.model)
        return stored

    def add_refval_key(self, who: Principal, tenant: str, key_id: str, public_pem: bytes) -> None:
        self.refvals.add_signing_key(tenant, key_id, public_pem)
        self._log(who, tenant, "refval-key-add", key_id=key_id)

    def put_reference_values(self, who: Principal, tenant: str, envelope: Any) -> ReferenceValues:
        values = self.refvals.put(tenant, envelope)
        self._log(who, tenant, "refvals-put", reference_values=values.id,
                  reference_values_version=values.version, digest=values.digest)
        return values

    def issue_tenant_token(self, who: Principal, tenant: str) -> tuple[str, str]:
        token_id, secret = self.tokens.issue_tenant_token(tenant, self._clock())
        self._log(who, tenant, "admin-token-issue", token_id=token_id)
        return token_id, secret
