"""Release policies are the tenant's (issue #32): a policy takes effect only when the tenant's
registered policy-admin key signed it, with a version above the stored one; the key is registered by
the tenant's own token and rotated only by a statement of the current key. Each refusal changes
nothing and is audited; the operator's token can do none of it."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from policy.release_documents import admin_key_statement, sign_release_policy
from protocol.model_ref import ModelRef
from tests.key_broker.conftest import MEASUREMENT, SIGNER, Harness

ROGUE = "ab" * 48  # the operator's own measurement
REF = ModelRef("acme", "m", "v1")


def _policy(version: int, measurements: tuple[str, ...] = (MEASUREMENT.hex(),), tenant: str = "acme") -> dict:
    return {"policy_id": f"{tenant}-m", "version": version, "tenant": tenant, "model": "m", "allowed_tee": ["sim"],
            "allowed_measurements": list(measurements), "required_signer": SIGNER, "unsafe_allow_simulated_tee": True}


@pytest.fixture()
def acme(kb: Harness) -> Harness:
    kb.setup_tenant("acme")  # version 1, signed by acme's registered key
    kb.setup_tenant("globex", model="g")
    return kb


def _tamper(envelope: dict) -> dict:
    out = copy.deepcopy(envelope)
    out["payload"]["allowed_measurements"].append(ROGUE)
    return out


def _rogue_v2() -> dict:
    return _policy(2, (MEASUREMENT.hex(), ROGUE))


# name -> (the envelope sent, the token sent: "operator" or "tenant")
NEGATIVES: list[tuple[str, Callable[[Harness], dict], str]] = [
    ("unsigned", lambda kb: _rogue_v2(), "operator"),
    ("unsigned-by-the-tenant", lambda kb: _rogue_v2(), "tenant"),
    ("signed-by-the-operator", lambda kb: sign_release_policy(_rogue_v2(), Ed25519PrivateKey.generate(), "acme-admin"),
     "operator"),
    ("signed-by-another-tenants-key", lambda kb: sign_release_policy(_rogue_v2(), kb.policy_key("globex"),
                                                                     "acme-admin"), "tenant"),
    ("another-tenants-key-id", lambda kb: sign_release_policy(_rogue_v2(), kb.policy_key("globex"), "globex-admin"),
     "tenant"),
    ("another-tenants-policy", lambda kb: kb.signed_policy("globex", {**_rogue_v2(), "tenant": "globex"}), "tenant"),
    ("replayed-older-version", lambda kb: kb.signed_policy("acme", _policy(1, (ROGUE,))), "tenant"),
    ("same-version", lambda kb: kb.signed_policy("acme", _policy(1, (MEASUREMENT.hex(), ROGUE))), "operator"),
    ("tampered-after-signing", lambda kb: _tamper(kb.signed_policy("acme", _policy(2))), "operator"),
    ("version-edited-after-signing",
     lambda kb: {**(e := kb.signed_policy("acme", _policy(2))), "payload": {**e["payload"], "version": 3}}, "tenant"),
    ("data-policy-signature",  # the tenant's signature over a data policy is not a release policy's
     lambda kb: {**kb.signed_policy("acme", _rogue_v2()), "sig": "00" * 64}, "tenant"),
]


def _release_state(kb: Harness) -> tuple[Any, Any]:
    return kb.service.policies.get(REF).to_dict(), json.loads(
        (kb.settings.data_dir / "policies" / "acme" / "m.json").read_text())


@pytest.mark.parametrize(("name", "make", "who"), NEGATIVES, ids=[n[0] for n in NEGATIVES])
def test_a_policy_the_tenant_did_not_sign_is_refused_changes_nothing_and_is_audited(
        acme: Harness, name: str, make: Callable[[Harness], dict], who: str) -> None:
    kb = acme
    before = _release_state(kb)
    envelope = make(kb)
    token = kb.admin_token if who == "operator" else kb.tenant_token("acme")
    r = kb.admin("PUT", "/tenants/acme/policies", token=token, json=envelope)
    assert r.status_code in (403, 422), r.text
    assert _release_state(kb) == before
    denial = [e for e in kb.audit_entries() if e["action"] == "policy-put"][-1]
    assert denial["decision"] == "deny" and denial["tenant"] == "acme", denial
    with pytest.raises(Exception):  # noqa: B017 (the rogue measurement gets nothing)
        kb.obtain("acme", measurement=bytes.fromhex(ROGUE))
    assert kb.obtain("acme").data_key  # the tenant's own policy still decides


def test_the_tenant_signs_a_newer_version_and_it_takes_effect(acme: Harness) -> None:
    kb = acme
    r = kb.admin("PUT", "/tenants/acme/policies", json=kb.signed_policy("acme", _policy(2, (ROGUE,))))
    assert r.status_code == 200, r.text  # whoever carries it: the signature is the authority
    assert kb.service.policies.get(REF).allowed_measurements == frozenset({ROGUE})
    entry = [e for e in kb.audit_entries() if e["action"] == "policy-put"][-1]
    assert entry["decision"] == "allow" and entry["metadata"]["signed_by"] == "acme-admin"


def test_a_policy_needs_a_registered_key(kb: Harness) -> None:
    assert kb.admin("POST", "/tenants/acme/key").status_code == 201
    r = kb.admin("PUT", "/tenants/acme/policies",
                 json=sign_release_policy(_policy(1), Ed25519PrivateKey.generate(), "acme-admin"))
    assert r.status_code == 403
    assert not (kb.settings.data_dir / "policies" / "acme").exists()


def test_a_stored_policy_without_the_tenants_signature_decides_nothing(acme: Harness) -> None:
    """Even a file that got into the ledger-protected store unsigned (an older broker's) is no policy."""
    kb = acme
    path = kb.settings.data_dir / "policies" / "acme" / "m.json"
    kb.service.policies._files.write(path, json.dumps(_policy(5, (MEASUREMENT.hex(), ROGUE))).encode())
    with pytest.raises(Exception):  # noqa: B017
        kb.obtain("acme")
    assert kb.admin("GET", "/tenants/acme/policies").json() == []


def _statement(tenant: str, new: Ed25519PrivateKey, kid: str, version: int, signer: Ed25519PrivateKey,
               signer_id: str) -> dict:
    return admin_key_statement(tenant, new.public_key(), kid, version, signer, signer_id)


def test_the_operator_cannot_register_or_replace_the_policy_admin_key(acme: Harness) -> None:
    kb = acme
    rogue = Ed25519PrivateKey.generate()
    path = kb.settings.data_dir / "policy-admin" / "acme.json"
    before = path.read_bytes()
    # Replace: the operator's own statement, with its token and with the tenant's.
    for token in (kb.admin_token, kb.tenant_token("acme")):
        r = kb.admin("PUT", "/tenants/acme/policy-admin-key", token=token,
                     json=_statement("acme", rogue, "rogue", 2, rogue, "rogue"))
        assert r.status_code == 403, r.text
    # Register for a tenant with no key yet: the operator's token is refused (audited).
    assert kb.admin("POST", "/tenants/initech/key").status_code == 201
    r = kb.admin("PUT", "/tenants/initech/policy-admin-key", json=_statement("initech", rogue, "rogue", 1, rogue,
                                                                             "rogue"))
    assert r.status_code == 403
    assert path.read_bytes() == before and not (kb.settings.data_dir / "policy-admin" / "initech.json").exists()
    denials = [e for e in kb.audit_entries() if e["decision"] == "deny"
               and e["action"] in ("policy-admin-key", "admin-auth")]
    assert {e["tenant"] for e in denials} == {"acme", "initech"} and len(denials) == 3


KEY_NEGATIVES = [
    ("first-key-not-self-signed", lambda old, new: _statement("acme", new, "k2", 1, old, "acme-admin")),
    ("rotation-signed-by-the-new-key", lambda old, new: _statement("acme", new, "k2", 2, new, "k2")),
    ("rotation-replays-version-1", lambda old, new: _statement("acme", new, "k2", 1, old, "acme-admin")),
    ("rotation-skips-a-version", lambda old, new: _statement("acme", new, "k2", 3, old, "acme-admin")),
    ("rotation-for-another-tenant", lambda old, new: _statement("globex", new, "k2", 2, old, "acme-admin")),
    ("rotation-tampered", lambda old, new: {**(s := _statement("acme", new, "k2", 2, old, "acme-admin")),
                                            "payload": {**s["payload"], "key_id": "k3"}}),
    ("rotation-reuses-a-key-id", lambda old, new: _statement("acme", new, "acme-admin", 2, old, "acme-admin")),
]


@pytest.mark.parametrize(("name", "make"), KEY_NEGATIVES, ids=[n[0] for n in KEY_NEGATIVES])
def test_bad_key_statements_are_refused(acme: Harness, name: str, make: Callable[..., dict]) -> None:
    kb = acme
    path = kb.settings.data_dir / "policy-admin" / "acme.json"
    before = path.read_bytes()
    r = kb.as_tenant("acme", "PUT", "/tenants/acme/policy-admin-key",
                     json=make(kb.policy_key("acme"), Ed25519PrivateKey.generate()))
    assert r.status_code == 403, r.text
    assert path.read_bytes() == before
    assert [e for e in kb.audit_entries() if e["action"] == "policy-admin-key"][-1]["decision"] == "deny"


def test_rotation_signed_by_the_current_key(acme: Harness) -> None:
    kb = acme
    old, new = kb.policy_key("acme"), Ed25519PrivateKey.generate()
    r = kb.as_tenant("acme", "PUT", "/tenants/acme/policy-admin-key",
                     json=_statement("acme", new, "acme-2", 2, old, "acme-admin"))
    assert r.status_code == 200 and r.json()["key_id"] == "acme-2", r.text
    assert kb.obtain("acme").data_key  # the policy signed before the rotation still decides
    stale = kb.admin("PUT", "/tenants/acme/policies", json=sign_release_policy(_policy(2), old, "acme-admin"))
    assert stale.status_code == 403  # new policies need the current key
    assert kb.admin("PUT", "/tenants/acme/policies", json=sign_release_policy(_policy(2), new, "acme-2")
                    ).status_code == 200


def test_data_key_import_needs_the_tenants_own_token(kb: Harness, sealed_upload: Any) -> None:
    assert kb.admin("POST", "/tenants/acme/key").status_code == 201
    body, _ = sealed_upload(kb.client.get("/v1/import-key").json()["public_key_pem"], "acme", "m", "v1")
    path = "/tenants/acme/models/m/versions/v1/data-key"
    assert kb.client.put(f"/v1/admin{path}", json=body).status_code == 401  # unauthenticated
    assert kb.admin("PUT", path, json=body).status_code == 403  # the operator's token
    assert kb.as_tenant("globex", "PUT", path, json=body).status_code == 403  # another tenant's
    assert not kb.service.datakeys.exists(REF)
    entries = kb.audit_entries()
    assert any(e["action"] == "edge-refusal" and e["metadata"]["status"] == 401
               and e["metadata"]["route"].endswith("/data-key") for e in entries)
    assert [e["metadata"]["role"] for e in entries if e["action"] == "admin-auth"] == ["admin", "tenant-admin"]
    assert kb.as_tenant("acme", "PUT", path, json=body).status_code == 201
