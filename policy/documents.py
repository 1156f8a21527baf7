"""Signed policy documents: a tenant admin signs a policy set; the control plane validates it on
upload and refuses rollbacks.

Envelope (JSON): ``{"payload": <policy set>, "key_id": ..., "alg": "Ed25519", "sig": hex}``.
The signature covers the canonical JSON of the payload, so whitespace or key order changes made
in transit do not matter but any change of meaning does. The same envelope, under another
domain-separation prefix, carries the tenant's release policies and policy-admin key statements
(policy/release_documents.py): a signature made for one kind never verifies as another.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Mapping
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from policy.audit.entry import canonical
from policy.errors import PolicyInvalid
from policy.policyset import PolicySet

_DOMAIN = b"sealed-policy-document-v1\x00"
ALG = "Ed25519"


def _digest(payload: Mapping[str, Any], domain: bytes = _DOMAIN) -> bytes:
    try:
        return hashlib.sha256(domain + canonical(payload)).digest()
    except (TypeError, ValueError) as exc:
        raise PolicyInvalid(f"policy payload is not canonical JSON: {exc}") from exc


def sign_envelope(payload: Mapping[str, Any], admin_key: Ed25519PrivateKey, key_id: str,
                  domain: bytes = _DOMAIN) -> dict[str, Any]:
    """The signed envelope of ``payload`` (already validated by the caller) under ``domain``."""
    return {"payload": dict(payload), "key_id": key_id, "alg": ALG,
            "sig": admin_key.sign(_digest(payload, domain)).hex()}


def envelope_parts(envelope: Any) -> tuple[Mapping[str, Any], str]:
    """(payload, key_id) of a well-formed envelope, before any signature check; raises PolicyInvalid."""
    if not isinstance(envelope, Mapping) or set(envelope) != {"payload", "key_id", "alg", "sig"}:
        raise PolicyInvalid("policy envelope must have exactly payload, key_id, alg, sig")
    if envelope["alg"] != ALG:
        raise PolicyInvalid(f"unsupported signature algorithm {str(envelope['alg'])[:32]!r}")
    payload, key_id = envelope["payload"], envelope["key_id"]
    if not isinstance(payload, Mapping) or not isinstance(payload.get("tenant"), str):
        raise PolicyInvalid("policy payload must be an object naming its tenant")
    if not isinstance(key_id, str) or not isinstance(envelope["sig"], str):
        raise PolicyInvalid("key_id and sig must be strings")
    return payload, key_id


def check_envelope_signature(envelope: Mapping[str, Any], key: Ed25519PublicKey, domain: bytes = _DOMAIN) -> None:
    """Raise PolicyInvalid unless ``key`` signed this envelope's payload under ``domain``."""
    payload, _ = envelope_parts(envelope)
    try:
        key.verify(bytes.fromhex(str(envelope["sig"])), _digest(payload, domain))
    except (InvalidSignature, ValueError) as exc:
        raise PolicyInvalid("policy signature does not verify") from exc


def sign_policy_document(policy: PolicySet | Mapping[str, Any], admin_key: Ed25519PrivateKey,
                         key_id: str) -> dict[str, Any]:
    """Validate (by parsing) and sign a policy set; returns the envelope to upload."""
    ps = policy if isinstance(policy, PolicySet) else PolicySet.from_dict(policy)
    return sign_envelope(ps.to_dict(), admin_key, key_id)


def verify_policy_document(envelope: Mapping[str, Any],
                           admin_keys: Mapping[str, Mapping[str, Ed25519PublicKey]]) -> PolicySet:
    """Check the signature with the *payload tenant's* admin keys, then parse and validate.

    ``admin_keys`` maps tenant -> key id -> public key, so one tenant's admin can never sign
    another tenant's policy.
    """
    payload, key_id = envelope_parts(envelope)
    key = admin_keys.get(payload["tenant"], {}).get(key_id)
    if key is None:
        raise PolicyInvalid("unknown admin key for this tenant")
    check_envelope_signature(envelope, key)
    return PolicySet.from_dict(payload)


class PolicyRegistry:
    """Current policy set per tenant; uploads must be signed and strictly newer (no rollback)."""

    def __init__(self, admin_keys: Mapping[str, Mapping[str, Ed25519PublicKey]]) -> None:
        self._admin_keys = admin_keys
        self._lock = threading.Lock()
        self._current: dict[str, PolicySet] = {}

    def upload(self, envelope: Mapping[str, Any]) -> PolicySet:
        ps = verify_policy_document(envelope, self._admin_keys)
        with self._lock:
            current = self._current.get(ps.tenant)
            if current is not None and ps.version <= current.version:
                raise PolicyInvalid(f"version {ps.version} is not newer than {current.version} (rollback)")
            self._current[ps.tenant] = ps
        return ps

    def get(self, tenant: str) -> PolicySet | None:
        with self._lock:
            return self._current.get(tenant)
