"""The tenant's policy-admin key as the broker knows it: the only authority over what releases the
tenant's keys (release policies are signed with it; policy/release_documents.py).

Registered once per tenant by a statement the key signs itself (version 1) answering an invitation
the broker issued for the tenant (key_broker/invitations.py: its nonce, unexpired, unused, naming
this broker instance; no trust on first use, issue #46); replaced only by a statement signed with
the current key (version + 1). Whoever answers an invitation first binds the key, so the tenant's
CLI checks the attested governing-key answer (protocol/broker/tenancy.py) before it sends anything.
Kept in ``policy-admin/<tenant>.json`` through the state ledger, with every key the tenant ever
registered (a policy signed before a rotation still verifies when it is read; new policies must be
signed by the current key).
"""

from __future__ import annotations

import datetime as dt
import json
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from key_broker.errors import KeyBrokerError, PolicyUnsigned
from key_broker.invitations import InvitationBook
from key_broker.names import check_name
from key_broker.statefile import StateFiles, UnsafePlainFiles
from policy.documents import check_envelope_signature, envelope_parts
from policy.errors import PolicyInvalid
from policy.release_documents import (
    ADMIN_KEY_ACCEPT_FIELDS,
    ADMIN_KEY_DOMAIN,
    ADMIN_KEY_FIELDS,
    load_admin_public_key,
)

DIRECTORY = "policy-admin"


@dataclass(frozen=True)
class AdminKeyRecord:
    tenant: str
    version: int
    key_id: str  # the current key: new statements must be signed by it
    keys: Mapping[str, str]  # every key id ever registered -> PEM

    def current(self) -> Ed25519PublicKey:
        return load_admin_public_key(self.keys[self.key_id])

    def public(self) -> dict[str, Any]:
        return {"tenant": self.tenant, "version": self.version, "key_id": self.key_id,
                "public_key_pem": self.keys[self.key_id]}


def _statement(envelope: Any, tenant: str) -> tuple[dict[str, Any], str]:
    try:
        payload, signer_id = envelope_parts(envelope)
    except PolicyInvalid as exc:
        raise PolicyUnsigned(f"key statement refused: {exc}") from exc
    if set(payload) not in (ADMIN_KEY_FIELDS, ADMIN_KEY_ACCEPT_FIELDS):
        raise PolicyUnsigned("key statement must name exactly tenant, key_id, public_key_pem, version (and, for a "
                             "first key, the invitation and broker_instance it answers)")
    if payload["tenant"] != tenant:
        raise PolicyUnsigned("key statement names another tenant")
    version = payload["version"]
    if type(version) is not int or version < 1:
        raise PolicyUnsigned("key statement version must be a positive int")
    if not isinstance(payload["key_id"], str) or not isinstance(payload["public_key_pem"], str):
        raise PolicyUnsigned("key statement key_id and public_key_pem must be strings")
    check_name(payload["key_id"], "key id")
    return dict(payload), signer_id


class PolicyAdminKeys:
    def __init__(self, root: Path, files: StateFiles | None = None, invitations: InvitationBook | None = None) -> None:
        self._root = root
        self._files = files if files is not None else UnsafePlainFiles(root)
        self._lock = threading.Lock()
        self.invitations = invitations if invitations is not None else InvitationBook(root, self._files)

    def _path(self, tenant: str) -> Path:
        return self._root / DIRECTORY / f"{check_name(tenant, 'tenant')}.json"

    def get(self, tenant: str) -> AdminKeyRecord | None:
        path = self._path(tenant)
        try:
            raw = self._files.read(path)  # authenticated by the state ledger
            if raw is None:
                return None
            doc = json.loads(raw)
            return AdminKeyRecord(tenant, int(doc["version"]), str(doc["key_id"]), dict(doc["keys"]))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise KeyBrokerError(f"policy-admin key file of {tenant} unreadable") from exc

    def require(self, tenant: str) -> AdminKeyRecord:
        record = self.get(tenant)
        if record is None:
            raise PolicyUnsigned(f"tenant {tenant} has registered no policy-admin key")
        return record

    def apply(self, tenant: str, envelope: Any, now: dt.datetime | None = None) -> AdminKeyRecord:
        """Register the first key (self-signed, version 1, answering an invitation issued here) or
        rotate (signed by the current key, version current + 1). Raises PolicyUnsigned and changes
        nothing otherwise (a refused acceptance leaves its invitation unused)."""
        payload, signer_id = _statement(envelope, tenant)
        try:
            new_key = load_admin_public_key(payload["public_key_pem"])
        except PolicyInvalid as exc:
            raise PolicyUnsigned(str(exc)) from exc
        with self._lock:
            current = self.get(tenant)
            if current is None:
                if payload["version"] != 1 or signer_id != payload["key_id"]:
                    raise PolicyUnsigned("a first policy-admin key is version 1, signed by itself")
                if set(payload) != ADMIN_KEY_ACCEPT_FIELDS:
                    raise PolicyUnsigned("a first policy-admin key must answer an invitation of this broker "
                                         "(no trust on first use): the operator's create-tenant call returns one")
                signer = new_key
                keys: dict[str, str] = {}
            else:
                if set(payload) == ADMIN_KEY_ACCEPT_FIELDS:
                    raise PolicyUnsigned(f"the invitation was used already: a policy-admin key governs {tenant} (if "
                                         "it is not the tenant's, someone else answered the invitation)")
                if payload["version"] != current.version + 1:
                    raise PolicyUnsigned(f"key statement version {payload['version']} is not "
                                         f"{current.version + 1}")
                if signer_id != current.key_id:
                    raise PolicyUnsigned("a key rotation must be signed by the current policy-admin key")
                if set(payload) != ADMIN_KEY_FIELDS:
                    raise PolicyUnsigned("a rotation answers no invitation")
                if payload["key_id"] in current.keys:
                    raise PolicyUnsigned("a rotation names a key id that was used before")
                signer = current.current()
                keys = dict(current.keys)
            try:
                check_envelope_signature(envelope, signer, ADMIN_KEY_DOMAIN)
            except PolicyInvalid as exc:
                raise PolicyUnsigned(f"key statement refused: {exc}") from exc
            if current is None:  # signed by the key it binds: now spend the invitation
                self.invitations.redeem(tenant, payload["invitation"], payload["broker_instance"],
                                        now or dt.datetime.now(dt.UTC))
            keys[payload["key_id"]] = payload["public_key_pem"]
            record = AdminKeyRecord(tenant, payload["version"], payload["key_id"], keys)
            self._files.write(self._path(tenant), json.dumps(
                {"tenant": tenant, "version": record.version, "key_id": record.key_id, "keys": keys,
                 "statement": dict(envelope)}, sort_keys=True).encode())
            return record

    def verify_current(self, tenant: str, envelope: Any, domain: bytes) -> dict[str, Any]:
        """The payload of a statement for ``tenant`` signed by its current policy-admin key; raises
        PolicyUnsigned otherwise."""
        try:
            payload, signer_id = envelope_parts(envelope)
        except PolicyInvalid as exc:
            raise PolicyUnsigned(f"statement refused: {exc}") from exc
        if payload["tenant"] != tenant:
            raise PolicyUnsigned("statement names another tenant")
        record = self.require(tenant)
        if signer_id != record.key_id:
            raise PolicyUnsigned("statement is not signed by the tenant's current policy-admin key")
        try:
            check_envelope_signature(envelope, record.current(), domain)
        except PolicyInvalid as exc:
            raise PolicyUnsigned(f"statement refused: {exc}") from exc
        return dict(payload)
