"""The tenant's signed revocation list: what its clients must refuse, whatever a broker says.

A broker's state can be rolled back with its anchors (docs/security.md); a revocation the tenant
signs cannot. The list is the policy envelope (policy/documents.py) under its own domain, signed by
the tenant's policy-admin key; a client checks it with the key it pins (sealed_client/tenant_pin.py)
and keeps the newest serial it has verified (its state file), so an older list cannot undo a newer one.

Payload: `{"tenant": "...", "serial": N, "revoked_admin_keys": [key id, ...],
"revoked_release_policies": [{"policy_id": "...", "version": N}, ...], "revoked_data_keys": [key id, ...]}`:
a policy-admin key whose signatures no longer count, release policies under which no key may have
come, and data keys (a package manifest's `key_id`) no worker may hold.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from policy.documents import check_envelope_signature, envelope_parts, sign_envelope
from policy.errors import PolicyInvalid

REVOCATION_DOMAIN = b"sealed-revocation-list-v1\x00"
_FIELDS = frozenset({"tenant", "serial", "revoked_admin_keys", "revoked_release_policies", "revoked_data_keys"})


@dataclass(frozen=True)
class RevocationList:
    tenant: str
    serial: int
    revoked_admin_keys: frozenset[str] = frozenset()
    revoked_release_policies: frozenset[tuple[str, int]] = frozenset()
    revoked_data_keys: frozenset[str] = frozenset()

    @classmethod
    def from_payload(cls, payload: Mapping[str, Any]) -> RevocationList:
        if not isinstance(payload, Mapping) or set(payload) - _FIELDS or not {"tenant", "serial"} <= set(payload):
            raise PolicyInvalid(f"a revocation list has exactly the keys {sorted(_FIELDS)} (tenant, serial required)")
        serial = payload["serial"]
        if type(serial) is not int or serial < 1:
            raise PolicyInvalid("a revocation list's serial must be a positive int")
        names = {}
        for key in ("revoked_admin_keys", "revoked_data_keys"):
            value = payload.get(key, [])
            if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
                raise PolicyInvalid(f"{key} must be a list of key ids")
            names[key] = frozenset(value)
        policies = payload.get("revoked_release_policies", [])
        if not isinstance(policies, list) or not all(
                isinstance(p, Mapping) and set(p) == {"policy_id", "version"} and isinstance(p["policy_id"], str)
                and type(p["version"]) is int for p in policies):
            raise PolicyInvalid("revoked_release_policies must be a list of {policy_id, version}")
        return cls(tenant=str(payload["tenant"]), serial=serial, revoked_admin_keys=names["revoked_admin_keys"],
                   revoked_data_keys=names["revoked_data_keys"],
                   revoked_release_policies=frozenset((p["policy_id"], p["version"]) for p in policies))

    def to_payload(self) -> dict[str, Any]:
        return {"tenant": self.tenant, "serial": self.serial, "revoked_admin_keys": sorted(self.revoked_admin_keys),
                "revoked_data_keys": sorted(self.revoked_data_keys),
                "revoked_release_policies": [{"policy_id": p, "version": v}
                                             for p, v in sorted(self.revoked_release_policies)]}


def sign_revocation_list(revocations: RevocationList, admin_key: Ed25519PrivateKey, key_id: str) -> dict[str, Any]:
    """The tenant's signed list (give it to its clients: the `revocations` file of their policy)."""
    return sign_envelope(revocations.to_payload(), admin_key, key_id, REVOCATION_DOMAIN)


def verify_revocation_list(envelope: Any, keys: Mapping[str, Ed25519PublicKey]) -> RevocationList:
    """The list, if one of `keys` (key id -> the tenant's policy-admin key) signed it; PolicyInvalid otherwise."""
    payload, key_id = envelope_parts(envelope)
    key = keys.get(key_id)
    if key is None:
        raise PolicyInvalid(f"the revocation list is signed by {key_id[:64]!r}, not a pinned tenant key")
    check_envelope_signature(envelope, key, REVOCATION_DOMAIN)
    revocations = RevocationList.from_payload(payload)
    if revocations.revoked_admin_keys & {key_id}:
        raise PolicyInvalid("the revocation list is signed by a key it revokes")
    return revocations
