"""Tenant operations behind the admin API and `sealed keys`: tenant keys (create, rotate with
re-wrap of every data key, revoke), data keys, release policies (signed by the tenant's
policy-admin key), the policy-admin key itself, reference values, receipts.
Each operation is audited with the acting principal, refusals included; none logs key material."""

from __future__ import annotations

import base64
import datetime as dt
import json
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from key_broker.admin_schemas import DataKeyUpload
from key_broker.attested import BrokerSelf
from key_broker.auth import AdminTokenStore, Principal
from key_broker.errors import KeyBrokerError, KeyStoreError, PolicyUnsigned
from key_broker.keystore import DataKeyRecord, DataKeyRegistry, KeyStore
from key_broker.names import check_name, check_ref
from key_broker.policies import PolicyStore, StoredPolicy
from key_broker.policy_admin import AdminKeyRecord
from key_broker.receipts import ReceiptBook
from key_broker.refvals import ReferenceValues, ReferenceValuesStore
from policy.audit import AuditLog
from policy.audit.entry import bounded_reason
from policy.errors import PolicyInvalid
from policy.release_documents import REFVAL_KEY_DOMAIN, REFVAL_KEY_FIELDS
from protocol.broker.tenancy import sign_governing_key, sign_invitation
from protocol.model_ref import ModelRef
from protocol.package import PackageError, read_manifest
from protocol.package.format import manifest_names
from protocol.package.keywrap import SealedDataKey, open_data_key
from protocol.package.signing import SIGNATURE_FILES

_SIGNATURE_FILES = frozenset(SIGNATURE_FILES)


class Conflict(KeyStoreError):
    """The resource exists already (a data key is never silently replaced)."""


@dataclass(frozen=True)
class RotationResult:
    kek_version: int
    rewrapped: int


class TenantAdmin:
    def __init__(self, *, keystore: KeyStore, datakeys: DataKeyRegistry, policies: PolicyStore,
                 refvals: ReferenceValuesStore, receipts: ReceiptBook, tokens: AdminTokenStore,
                 audit: AuditLog, clock: Callable[[], dt.datetime], import_key: X25519PrivateKey,
                 attested: BrokerSelf | None = None) -> None:
        self.import_key = import_key  # tenants seal data keys to its public half (GET /v1/import-key)
        self.attested = attested  # its instance key signs invitations and governing-key answers
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

    def refused(self, who: Principal, tenant: str, action: str, exc: Exception, **meta: Any) -> None:
        """Audit a refused admin operation (the caller re-raises: nothing was changed)."""
        self._audit.append(tenant=tenant, action=action, decision="deny",
                           reason=bounded_reason(f"{type(exc).__name__}: {exc}"),
                           metadata={"principal": who.token_id, "role": who.role, **meta})

    def create_tenant_key(self, who: Principal, tenant: str) -> None:
        check_name(tenant, "tenant")
        if self.keystore.has_tenant_key(tenant):
            raise Conflict(f"tenant {tenant} already has a key")
        self.keystore.create_tenant_key(tenant)
        self._log(who, tenant, "tenant-key-create")

    def _instance(self) -> BrokerSelf:
        if self.attested is None:
            raise KeyStoreError("this broker has no attested instance identity")
        return self.attested

    def invite(self, who: Principal, tenant: str) -> dict[str, Any]:
        """An invitation for the tenant's first policy-admin key (signed by this broker instance). Its
        nonce is spent by the first acceptance; the tenant's CLI checks whose key that was."""
        check_name(tenant, "tenant")
        attested = self._instance()
        if self.policies.admin_keys.get(tenant) is not None:
            raise Conflict(f"a policy-admin key governs {tenant} already (rotations are signed by it)")
        nonce, expires = self.policies.admin_keys.invitations.issue(tenant, attested.identity.instance_id,
                                                                    self._clock())
        self._log(who, tenant, "tenant-invite", nonce=nonce[:16])
        return sign_invitation(attested.instance_key, tenant, nonce, expires)

    def governing_key(self, tenant: str, nonce: str) -> dict[str, Any]:
        """The attested answer of which policy-admin key governs ``tenant`` here, for ``nonce``."""
        record = self.policies.admin_keys.get(check_name(tenant, "tenant"))
        return sign_governing_key(self._instance().instance_key, tenant, nonce,
                                  record.public() if record is not None else None)

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

    def put_sealed_data_key(self, who: Principal, ref: ModelRef, upload: DataKeyUpload) -> DataKeyRecord:
        """Open a data key sealed to our import key, for exactly the signed package it names.
        Refusals are audited."""
        try:
            return self._put_sealed_data_key(who, ref, upload)
        except KeyBrokerError as exc:
            self.refused(who, ref.tenant, "data-key-register", exc, model=ref.model, version=ref.version)
            raise

    def _put_sealed_data_key(self, who: Principal, ref: ModelRef, upload: DataKeyUpload) -> DataKeyRecord:
        check_ref(ref)
        if self.datakeys.exists(ref):
            raise Conflict(f"{ref} already has a data key; publish a new version")
        if not set(upload.signature_files) <= _SIGNATURE_FILES:
            raise KeyStoreError("unexpected signature file names")
        try:
            with tempfile.TemporaryDirectory(prefix="sealed-manifest-") as tmp:
                # Public material only (manifest and signatures); the signer check needs files.
                (Path(tmp) / "manifest.json").write_bytes(base64.b64decode(upload.manifest, validate=True))
                for name, blob in upload.signature_files.items():
                    (Path(tmp) / name).write_bytes(base64.b64decode(blob, validate=True))
                manifest, _, signer = read_manifest(Path(tmp))
            sealed = SealedDataKey.from_json(json.dumps(upload.sealed_key))
        except (PackageError, ValueError) as exc:
            raise KeyStoreError(f"sealed key upload refused: {type(exc).__name__}") from exc
        if not manifest_names(manifest, ref):
            raise KeyStoreError("the manifest names another tenant, model or version")
        try:
            data_key = open_data_key(sealed, self.import_key, manifest)
        except PackageError as exc:
            raise KeyStoreError(f"sealed key does not open for this package: {type(exc).__name__}") from exc
        record = self.datakeys.register(ref, data_key, manifest.key_id, signer,
                                        manifest.plaintext_digest)
        self._log(who, ref.tenant, "data-key-register", model=ref.model, version=ref.version,
                  key_id=manifest.key_id[:64])
        return record

    def put_policy(self, who: Principal, tenant: str, envelope: dict[str, Any]) -> StoredPolicy:
        """Store a release policy signed by the tenant's policy-admin key (whoever carries it: the
        bearer token is transport, the signature is the authority). Refusals are audited."""
        try:
            payload = envelope.get("payload") if isinstance(envelope, dict) else None
            if isinstance(payload, dict) and payload.get("tenant") != tenant:
                raise PolicyUnsigned("the policy names another tenant")
            if isinstance(payload, dict) and isinstance(payload.get("reference_values"), str):
                self.refvals.load(tenant, str(payload["reference_values"]))  # must exist and verify now
            stored = self.policies.put(envelope)
        except (KeyBrokerError, PolicyInvalid) as exc:
            self.refused(who, tenant, "policy-put", exc)
            raise
        self._log(who, tenant, "policy-put", policy_id=stored.policy.policy_id[:64],
                  policy_version=stored.policy.version, model=stored.policy.model,
                  signed_by=str(envelope.get("key_id"))[:64])
        return stored

    def put_admin_key(self, who: Principal, tenant: str, envelope: Any) -> AdminKeyRecord:
        """Register the tenant's policy-admin key (self-signed, by the tenant's own token) or
        rotate it (signed by the current key). Refusals are audited."""
        try:
            record = self.policies.admin_keys.apply(tenant, envelope, self._clock())
        except KeyBrokerError as exc:
            self.refused(who, tenant, "policy-admin-key", exc)
            raise
        self._log(who, tenant, "policy-admin-key", key_id=record.key_id, key_version=record.version)
        return record

    def add_refval_key(self, who: Principal, tenant: str, key_id: str, envelope: Any) -> None:
        """Pin a signer of the tenant's reference values: its measurements join release policies, so
        only a statement of the tenant's policy-admin key pins one. Refusals are audited."""
        try:
            payload = self.policies.admin_keys.verify_current(tenant, envelope, REFVAL_KEY_DOMAIN)
            if set(payload) != REFVAL_KEY_FIELDS or payload["key_id"] != key_id:
                raise PolicyUnsigned("the pin must name exactly this tenant, this key id and its PEM")
            self.refvals.add_signing_key(tenant, key_id, str(payload["public_key_pem"]).encode())
        except KeyBrokerError as exc:
            self.refused(who, tenant, "refval-key-add", exc, key_id=key_id[:64])
            raise
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
