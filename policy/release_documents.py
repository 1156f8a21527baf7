"""The tenant's signed statements to the key broker, in the envelope of policy/documents.py.

- A release policy: the payload is the release policy's JSON (``ReleasePolicy.to_dict()``, plus an
  optional ``reference_values`` id), signed by the tenant's policy-admin key, the same Ed25519 key
  that signs its data policies.
- A policy-admin key statement: the payload names the tenant, the key (id and PEM) and a version.
  Version 1 registers the tenant's first key and is signed by that key itself (proof of
  possession); each later version names a new key and is signed by the key it replaces.
- A reference-value key pin: the payload names the tenant and a key (id and PEM) that may sign the
  tenant's reference values (whose measurements join a release policy), signed by the tenant's
  policy-admin key.

Each kind has its own domain-separation prefix, so a signed data policy never verifies as a release
policy or a key statement, nor the other way round.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from policy.documents import sign_envelope
from policy.errors import PolicyInvalid
from policy.release import ReleasePolicy

RELEASE_DOMAIN = b"sealed-release-policy-v1\x00"
ADMIN_KEY_DOMAIN = b"sealed-policy-admin-key-v1\x00"
REFERENCE_KEY = "reference_values"
ADMIN_KEY_FIELDS = frozenset({"tenant", "key_id", "public_key_pem", "version"})
# A first key answers the broker's invitation (issue #46): it names the invitation's nonce and the
# broker instance, so the binding is made once, at that broker, and never replayed elsewhere.
ADMIN_KEY_ACCEPT_FIELDS = ADMIN_KEY_FIELDS | {"invitation", "broker_instance"}
REFVAL_KEY_DOMAIN = b"sealed-refval-key-v1\x00"
REFVAL_KEY_FIELDS = frozenset({"tenant", "key_id", "public_key_pem"})


def release_payload(policy: ReleasePolicy | Mapping[str, Any]) -> dict[str, Any]:
    """The canonical payload of a release policy (validated by parsing it)."""
    if isinstance(policy, ReleasePolicy):
        return policy.to_dict()
    if not isinstance(policy, Mapping):
        raise PolicyInvalid("release policy must be a JSON object")
    rest = {k: v for k, v in policy.items() if k != REFERENCE_KEY}
    ref = policy.get(REFERENCE_KEY)
    return {**ReleasePolicy.from_dict(rest).to_dict(), **({REFERENCE_KEY: ref} if ref is not None else {})}


def sign_release_policy(policy: ReleasePolicy | Mapping[str, Any], admin_key: Ed25519PrivateKey,
                        key_id: str) -> dict[str, Any]:
    """The envelope the broker's `PUT /v1/admin/tenants/{tenant}/policies` takes."""
    return sign_envelope(release_payload(policy), admin_key, key_id, RELEASE_DOMAIN)


def public_pem(key: Ed25519PublicKey) -> str:
    return key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode()


def admin_key_statement(tenant: str, new_key: Ed25519PublicKey, new_key_id: str, version: int,
                        signer: Ed25519PrivateKey, signer_key_id: str) -> dict[str, Any]:
    """Register (version 1, ``signer`` is the new key) or rotate to ``new_key`` (signed by the current)."""
    payload = {"tenant": tenant, "key_id": new_key_id, "public_key_pem": public_pem(new_key), "version": version}
    return sign_envelope(payload, signer, signer_key_id, ADMIN_KEY_DOMAIN)


def invitation_acceptance(tenant: str, key: Ed25519PrivateKey, key_id: str, invitation: Mapping[str, Any]
                          ) -> dict[str, Any]:
    """The tenant's first policy-admin key (version 1), signed by itself, answering ``invitation``
    (its payload: nonce and broker instance, checked by the caller: protocol/broker/tenancy.py)."""
    payload = {"tenant": tenant, "key_id": key_id, "public_key_pem": public_pem(key.public_key()), "version": 1,
               "invitation": str(invitation["nonce"]), "broker_instance": str(invitation["broker_instance"])}
    return sign_envelope(payload, key, key_id, ADMIN_KEY_DOMAIN)


def refval_key_statement(tenant: str, key_id: str, refval_key: Ed25519PublicKey, admin_key: Ed25519PrivateKey,
                         admin_key_id: str) -> dict[str, Any]:
    """The tenant pins ``refval_key`` as a signer of its reference values (signed by its policy-admin key)."""
    payload = {"tenant": tenant, "key_id": key_id, "public_key_pem": public_pem(refval_key)}
    return sign_envelope(payload, admin_key, admin_key_id, REFVAL_KEY_DOMAIN)


def load_admin_public_key(pem: str) -> Ed25519PublicKey:
    try:
        key = serialization.load_pem_public_key(pem.encode())
    except (ValueError, TypeError) as exc:
        raise PolicyInvalid("policy-admin key is not a PEM public key") from exc
    if not isinstance(key, Ed25519PublicKey):
        raise PolicyInvalid("policy-admin key must be Ed25519")
    return key
