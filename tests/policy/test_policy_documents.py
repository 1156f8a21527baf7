"""Signed policy documents: signature, tenant binding, rollback, validation on upload."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from policy import PolicyInvalid, PolicyRegistry, PolicySet, sign_policy_document, verify_policy_document

ACME_ADMIN = Ed25519PrivateKey.generate()
GLOBEX_ADMIN = Ed25519PrivateKey.generate()
ADMIN_KEYS = {"acme": {"admin-1": ACME_ADMIN.public_key()}, "globex": {"admin-1": GLOBEX_ADMIN.public_key()}}
DOC: dict[str, Any] = {"policy_id": "acme-main", "version": 1, "tenant": "acme",
                       "admission": {"allowed_models": ["llama"]}}


def test_sign_and_verify() -> None:
    env = sign_policy_document(DOC, ACME_ADMIN, "admin-1")
    ps = verify_policy_document(env, ADMIN_KEYS)
    assert isinstance(ps, PolicySet) and ps.tenant == "acme" and ps.version == 1


def _mutate(env: dict[str, Any], how: str) -> dict[str, Any]:
    env = copy.deepcopy(env)
    if how == "payload":
        env["payload"]["admission"]["allowed_models"].append("gpt")
    elif how == "version":
        env["payload"]["version"] = 99
    elif how == "tenant":
        env["payload"]["tenant"] = "globex"
    elif how == "sig":
        env["sig"] = "00" * 64
    elif how == "key_id":
        env["key_id"] = "admin-2"
    elif how == "alg":
        env["alg"] = "none"
    elif how == "extra":
        env["note"] = "hi"
    return env


@pytest.mark.parametrize("how", ["payload", "version", "tenant", "sig", "key_id", "alg", "extra"])
def test_tampered_envelope_rejected(how: str) -> None:
    env = sign_policy_document(DOC, ACME_ADMIN, "admin-1")
    with pytest.raises(PolicyInvalid):
        verify_policy_document(_mutate(env, how), ADMIN_KEYS)


def test_other_tenants_admin_cannot_sign() -> None:
    env = sign_policy_document(DOC, GLOBEX_ADMIN, "admin-1")
    with pytest.raises(PolicyInvalid, match="signature"):
        verify_policy_document(env, ADMIN_KEYS)


def test_invalid_policy_is_not_signed_or_accepted() -> None:
    with pytest.raises(PolicyInvalid):
        sign_policy_document({**DOC, "cedar": "permit(principal, action, resource);"}, ACME_ADMIN, "admin-1")


def test_registry_refuses_rollback() -> None:
    reg = PolicyRegistry(ADMIN_KEYS)
    reg.upload(sign_policy_document({**DOC, "version": 2}, ACME_ADMIN, "admin-1"))
    with pytest.raises(PolicyInvalid, match="rollback"):
        reg.upload(sign_policy_document({**DOC, "version": 2}, ACME_ADMIN, "admin-1"))
    with pytest.raises(PolicyInvalid, match="rollback"):
        reg.upload(sign_policy_document(DOC, ACME_ADMIN, "admin-1"))
    reg.upload(sign_policy_document({**DOC, "version": 3}, ACME_ADMIN, "admin-1"))
    current = reg.get("acme")
    assert current is not None and current.version == 3 and reg.get("globex") is None
