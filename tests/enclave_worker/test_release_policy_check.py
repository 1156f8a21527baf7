"""The worker verifies the tenant's signature on the release policy its key was released under
(a broker the operator runs with its own state cannot make it): a table of refusals."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from enclave_worker.release_policy_check import check_tenant_release_policy
from policy.release import ReleasePolicy
from policy.release_documents import public_pem, sign_release_policy
from protocol.broker.errors import BrokerNotAuthenticated
from protocol.model_ref import ModelRef

REF = ModelRef("acme", "m", "v1")
SIGNER = "ed25519:" + "ab" * 32
TENANT_KEY = Ed25519PrivateKey.generate()


def _policy(**changes: Any) -> ReleasePolicy:
    fields: dict[str, Any] = {"policy_id": "p", "version": 3, "tenant": "acme", "model": "m",
                              "allowed_tee": frozenset({"snp"}), "allowed_measurements": frozenset({"aa" * 48}),
                              "required_signer": SIGNER}
    fields.update(changes)
    return ReleasePolicy(**fields)


RECEIPT = {"policy_id": "p", "policy_version": 3, "signer": SIGNER}


@pytest.fixture()
def admin_key(tmp_path: Path) -> Path:
    path = tmp_path / "policy-admin.pub"
    path.write_text(public_pem(TENANT_KEY.public_key()))
    return path


def test_the_tenants_policy_naming_the_receipts_signer_passes(admin_key: Path) -> None:
    envelope = sign_release_policy(_policy(), TENANT_KEY, "k1")
    assert check_tenant_release_policy(envelope, admin_key, REF, RECEIPT).version == 3
    versioned = sign_release_policy(_policy(model_version="v1"), TENANT_KEY, "k1")
    check_tenant_release_policy(versioned, admin_key, REF, RECEIPT)


def _tampered() -> dict[str, Any]:
    envelope = sign_release_policy(_policy(), TENANT_KEY, "k1")
    envelope["payload"] = {**envelope["payload"], "required_signer": "ed25519:" + "cd" * 32}
    return envelope


OTHER = Ed25519PrivateKey.generate()
CASES = {
    "no policy": (None, RECEIPT, "no tenant-signed release policy"),
    "signed by the operator": (sign_release_policy(_policy(), OTHER, "k1"), RECEIPT,
                               "not signed by this worker's tenant"),
    "edited after signing": (_tampered(), RECEIPT, "not signed by this worker's tenant"),
    "not an envelope": ({"payload": {}}, RECEIPT, "not signed by this worker's tenant"),
    "another tenant": (sign_release_policy(_policy(tenant="other"), TENANT_KEY, "k1"), RECEIPT, "another model"),
    "another model": (sign_release_policy(_policy(model="n"), TENANT_KEY, "k1"), RECEIPT, "another model"),
    "another version": (sign_release_policy(_policy(model_version="v2"), TENANT_KEY, "k1"), RECEIPT, "another model"),
    "receipt names an older policy": (sign_release_policy(_policy(), TENANT_KEY, "k1"),
                                      {**RECEIPT, "policy_version": 2}, "another release policy"),
    "receipt names another policy id": (sign_release_policy(_policy(), TENANT_KEY, "k1"),
                                        {**RECEIPT, "policy_id": "q"}, "another release policy"),
    "receipt names another signer": (sign_release_policy(_policy(), TENANT_KEY, "k1"),
                                     {**RECEIPT, "signer": "ed25519:" + "ef" * 32}, "package signer"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_refusals(case: str, admin_key: Path) -> None:
    envelope, receipt, message = CASES[case]
    with pytest.raises(BrokerNotAuthenticated, match=message):
        check_tenant_release_policy(envelope, admin_key, REF, receipt)


def test_the_workers_floor_refuses_an_older_release_policy(admin_key: Path) -> None:
    """A rolled-back broker state (an older, still tenant-signed policy) is refused below the floor."""
    envelope = sign_release_policy(_policy(), TENANT_KEY, "k1")
    assert check_tenant_release_policy(envelope, admin_key, REF, RECEIPT, min_version=3).version == 3
    with pytest.raises(BrokerNotAuthenticated, match=r"older than this worker's floor \(version 4\)"):
        check_tenant_release_policy(envelope, admin_key, REF, RECEIPT, min_version=4)


def test_an_unreadable_admin_key_refuses(tmp_path: Path) -> None:
    with pytest.raises(BrokerNotAuthenticated):
        check_tenant_release_policy(sign_release_policy(_policy(), TENANT_KEY, "k1"), tmp_path / "absent.pub",
                                    REF, RECEIPT)
