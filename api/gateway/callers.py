"""The tenant's signed caller policy, enforced by the gateway for plaintext requests (sealed ones: by
the worker, from the credential inside the envelope; enclave_worker/sealed.py).

The gateway reads the `callers` section of the tenant's policy set that its store holds, and only from
a document whose signature verifies with the tenant admin's key stored beside it (the key the workers
are started with). A stored document with a `callers` section that does not verify refuses every
plaintext caller (fail closed). Plaintext requests are the gateway's to read anyway: this check stops
an operator's management login (a key it makes for the tenant), not an operator that rewrites the
gateway; a tenant that distrusts the operator sets `require_sealed` and relies on the worker's check.
"""

from __future__ import annotations

from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from api.gateway.errors import GatewayError
from policy.callers import CallerPolicy, CallerRefused
from policy.documents import verify_policy_document
from policy.errors import PolicyError


class _Unverified:
    """A `callers` section the gateway cannot trust: refuses every caller."""

    def check_key_id(self, key_id: str) -> None:
        raise CallerRefused("the tenant's stored caller policy does not verify with its admin key: no caller "
                            "is admitted")


def caller_policy(tenant: str, row: Any) -> CallerPolicy | _Unverified | None:
    """The caller policy of a store's policy row (None: no row, or no `callers` section)."""
    doc = row.document if row is not None else None
    payload = doc.get("payload", doc) if isinstance(doc, dict) else None
    if not isinstance(doc, dict) or not isinstance(payload, dict) or payload.get("callers") is None:
        return None
    try:
        key = serialization.load_pem_public_key((row.admin_key_pem or "").encode())
        if not isinstance(key, Ed25519PublicKey):
            return _Unverified()
        policy_set = verify_policy_document(doc, {tenant: {str(doc.get("key_id")): key}})
    except (ValueError, TypeError, PolicyError):
        return _Unverified()
    return policy_set.callers


def check_plaintext_caller(policy: CallerPolicy | _Unverified | None, key_id: str) -> None:
    """Raise the 403 a plaintext request of `key_id` gets when the tenant's caller policy does not list it."""
    if policy is None:
        return
    try:
        policy.check_key_id(key_id)
    except CallerRefused as exc:
        raise GatewayError(403, f"caller refused: {exc}", type_="permission_error", code="caller_not_allowed") from exc
