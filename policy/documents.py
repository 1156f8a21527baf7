"""Signed policy documents: a tenant admin signs a policy set; the control plane validates it on
upload and refuses rollbacks.

Envelope (JSON): ``{"payload": <policy set>, "key_id": ..., "alg": "Ed25519", "sig": hex}``.
The signature covers the canonical JSON of the payload, so whitespace or key order changes made
in transit do not matter but any change of meaning does.
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


def _digest(payload: Mapping[str, Any]) -> bytes:
    try:
        return hashlib.sha256(_DOMAIN + canonical(payload)).digest()
    except (TypeError, ValueError) as exc:
        raise PolicyInvalid(f"policy payload is not canonical JSON: {exc}") from exc


def sign_policy_document(policy: PolicySet | Mapping[str, Any], admin_key: Ed25519PrivateKey,
                         key_id: str) -> dict[str, Any]:
    """Validate (by parsing) and sign a policy set; returns the envelope to upload."""
    ps = policy if isinstance(policy, PolicySet) else PolicySet.from_dict(policy)
    payload = ps.to_dict()
    return {"payload": payload, "key_id": key_id, "alg": ALG, "sig": admin_key.sign(_digest(payload)).hex()}


def verify_policy_document(envelope: Mapping[str, Any],
                           admin_keys: Mapping[str, Mapping[str, Ed25519PublicKey]]) -> PolicySet:
    """Check the signature with the *payload tenant's* admin keys, then parse and validate.

    ``admin_keys`` maps tenant -> key id -> public key, so one tenant's admin can never sign
    another tenant's policy.
    """
    if not isinstance(envelope, Mapping) or set(envelope) != {"payload", "key_id", "alg", "sig"}:
        raise PolicyInvalid("policy envelope must have exactly payload, key_id, alg, sig")
    if envelope["alg"] != ALG:
        raise PolicyInvalid(f"unsupported signature algorithm {envelope['alg']!r}")
    payload = envelope["payload"]
    if not isinstance(payload, Mapping) or not isinstance(payload.get("tenant"), str):
        raise PolicyInvalid("policy payload must be an object naming its tenant")
    key = admin_keys.get(payload["tenant"], {}).get(str(envelope["key_id"]))
    if key is None:
        raise PolicyInvalid("unknown admin key for this tenant")
    try:
        key.verify(bytes.fromhex(str(envelope["sig"])), _digest(payload))
    except (InvalidSignature, ValueError) as exc:
        raise PolicyInvalid("policy signature does not verify") from exc
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
