"""Which policy-admin key governs a tenant at a broker instance: the invitation and the attested answer
(issue #46, no trust on first use). Shared by the broker and the tenant's CLI.

1. The operator creates a tenant; the broker answers with an *invitation*, signed by the broker
   instance's key (the Ed25519 `instance_key` its attested identity names, made at its
   initialisation): {tenant, nonce, broker instance, expiry}. It reaches the tenant out of band.
2. The tenant verifies the broker's evidence (measurement pinned), then the invitation under the
   attested instance key, and answers with its policy-admin key's own statement naming the
   invitation's nonce and the broker instance (policy/release_documents.py::invitation_acceptance).
   The broker binds the key only for a nonce it issued for this tenant, unexpired, never used, that
   names this instance, signed by the key being bound; a binding is never replayable elsewhere.
3. Anyone holding the invitation can answer it, the operator too: the broker cannot tell whose key
   it is. So before every data key, policy or registration it sends, the tenant's CLI asks the
   broker which key governs the tenant, with a fresh nonce, and checks the answer (signed by the
   attested instance key, naming that nonce) names the tenant's own key; otherwise it refuses. An
   operator who answered first denies the tenant service; it never receives the tenant's keys.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from collections.abc import Mapping
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from protocol.broker.errors import BrokerClientError

INVITATION_FORMAT = "sealed-tenant-invitation-v1"
GOVERNING_FORMAT = "sealed-tenant-governing-key-v1"
_INVITATION_DOMAIN = INVITATION_FORMAT.encode() + b"\x00"
_GOVERNING_DOMAIN = GOVERNING_FORMAT.encode() + b"\x00"
NONCE_HEX = 64


class TenancyRefused(BrokerClientError):
    """An invitation or a governing-key answer does not verify, or names a key that is not the tenant's."""


def _digest(payload: Mapping[str, Any], domain: bytes) -> bytes:
    return hashlib.sha256(domain + json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()).digest()


def _sign(payload: dict[str, Any], key: Ed25519PrivateKey, domain: bytes) -> dict[str, Any]:
    return {"payload": payload, "sig": key.sign(_digest(payload, domain)).hex()}


def _verified(doc: Any, instance_key: bytes, domain: bytes, fields: frozenset[str], what: str) -> dict[str, Any]:
    if not isinstance(doc, Mapping) or set(doc) != {"payload", "sig"} or not isinstance(doc["payload"], Mapping):
        raise TenancyRefused(f"not a {what}")
    payload = dict(doc["payload"])
    if set(payload) != fields:
        raise TenancyRefused(f"{what}: unexpected fields")
    try:
        Ed25519PublicKey.from_public_bytes(instance_key).verify(bytes.fromhex(str(doc["sig"])),
                                                                _digest(payload, domain))
    except (InvalidSignature, ValueError) as exc:
        raise TenancyRefused(f"{what}: the signature does not verify under the attested broker instance key") from exc
    if payload["broker_instance"] != instance_key.hex():
        raise TenancyRefused(f"{what} names another broker instance")
    return payload


INVITATION_FIELDS = frozenset({"format", "tenant", "nonce", "broker_instance", "expires"})


def sign_invitation(instance_key: Ed25519PrivateKey, tenant: str, nonce: str, expires: dt.datetime) -> dict[str, Any]:
    raw = instance_key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return _sign({"format": INVITATION_FORMAT, "tenant": tenant, "nonce": nonce, "broker_instance": raw.hex(),
                  "expires": expires.astimezone(dt.UTC).isoformat()}, instance_key, _INVITATION_DOMAIN)


def check_invitation(doc: Any, *, instance_key: bytes, tenant: str, now: dt.datetime) -> dict[str, Any]:
    """The invitation's payload, if the attested broker instance signed it for ``tenant`` and it has
    not expired; else TenancyRefused."""
    payload = _verified(doc, instance_key, _INVITATION_DOMAIN, INVITATION_FIELDS, "tenant invitation")
    if payload["format"] != INVITATION_FORMAT:
        raise TenancyRefused("tenant invitation: unknown format")
    if payload["tenant"] != tenant:
        raise TenancyRefused(f"the invitation is for tenant {str(payload['tenant'])[:64]!r}, not {tenant!r}")
    nonce = payload["nonce"]
    if not isinstance(nonce, str) or len(nonce) != NONCE_HEX or set(nonce) - set("0123456789abcdef"):
        raise TenancyRefused("tenant invitation: malformed nonce")
    try:
        expires = dt.datetime.fromisoformat(str(payload["expires"]))
    except ValueError as exc:
        raise TenancyRefused("tenant invitation: malformed expiry") from exc
    if expires.tzinfo is None or now >= expires:
        raise TenancyRefused("the tenant invitation has expired: ask the operator for a new one")
    return payload


GOVERNING_FIELDS = frozenset({"format", "tenant", "nonce", "broker_instance", "key_id", "public_key_pem",
                              "key_version"})


def sign_governing_key(instance_key: Ed25519PrivateKey, tenant: str, nonce: str,
                       record: Mapping[str, Any] | None) -> dict[str, Any]:
    """The broker's answer: which key governs ``tenant`` here (None: none bound yet), for this nonce."""
    raw = instance_key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return _sign({"format": GOVERNING_FORMAT, "tenant": tenant, "nonce": nonce, "broker_instance": raw.hex(),
                  "key_id": record["key_id"] if record else None,
                  "public_key_pem": record["public_key_pem"] if record else None,
                  "key_version": record["version"] if record else None}, instance_key, _GOVERNING_DOMAIN)


def check_governing_key(doc: Any, *, instance_key: bytes, tenant: str, nonce: str, own_public_pem: str) -> str:
    """The key id of the tenant's own policy-admin key, if the attested broker instance says, for this
    nonce, that it is the key governing ``tenant``; else TenancyRefused naming what differs."""
    payload = _verified(doc, instance_key, _GOVERNING_DOMAIN, GOVERNING_FIELDS, "governing-key answer")
    if payload["format"] != GOVERNING_FORMAT or payload["tenant"] != tenant:
        raise TenancyRefused("the governing-key answer is for another tenant")
    if payload["nonce"] != nonce:
        raise TenancyRefused("the governing-key answer names another nonce (replayed)")
    if payload["public_key_pem"] is None:
        raise TenancyRefused(f"no policy-admin key governs {tenant} at this broker yet: accept its invitation first")
    if payload["public_key_pem"].strip() != own_public_pem.strip():
        raise TenancyRefused(f"tenant {tenant} at this broker is governed by policy-admin key "
                             f"{str(payload['key_id'])[:64]!r}, which is NOT yours: someone else (the operator?) "
                             "answered its invitation. Nothing was sent; do not use this broker for this tenant")
    return str(payload["key_id"])
