"""Admin API: authentication chain, tenant key rotation and revocation (with the worker's status
poll), reference values, receipts verified offline, input limits and rate limits."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from typer.testing import CliRunner

from api.cli.keys import build as build_keys_cli
from key_broker.errors import SettingsError
from key_broker.refvals import sign_reference_values
from key_broker.settings import BrokerSettings, admin_token_hashes
from policy.release_documents import refval_key_statement
from protocol.broker.client import check_key_status
from protocol.broker.errors import BrokerRateLimited, BrokerRefused
from protocol.model_ref import ModelRef
from protocol.package.signing import signer_identity

Harness = Any
MEASUREMENT = bytes(range(48)).hex()
SIGNER = signer_identity(Ed25519PrivateKey.from_private_bytes(bytes(range(32))).public_key())  # as conftest


def test_admin_routes_need_a_valid_bearer_token(kb: Harness) -> None:
    assert kb.client.post("/v1/admin/tenants/acme/key").status_code == 401
    assert kb.admin("POST", "/tenants/acme/key", token="not-a-token").status_code == 401
    assert kb.admin("POST", "/tenants/acme/key").status_code == 201


def test_tenant_admin_manages_only_its_own_tenant(kb: Harness) -> None:
    kb.setup_tenant("acme")
    kb.setup_tenant("globex")
    issued = kb.admin("POST", "/tenants/acme/admin-tokens")
    assert issued.status_code == 201
    acme = issued.json()["token"]
    assert kb.admin("GET", "/tenants/acme", token=acme).status_code == 200
    assert kb.admin("GET", "/tenants/acme/receipts", token=acme).status_code == 200
    for method, path in (
        ("GET", "/tenants/globex"),
        ("GET", "/tenants/globex/receipts"),
        ("POST", "/tenants/globex/key/rotate"),
        ("POST", "/tenants/globex/key/revoke"),
        ("GET", "/tenants/globex/policies"),
    ):
        assert kb.admin(method, path, token=acme).status_code == 403, path
    # Operator-only operations stay operator-only for tenant admins.
    assert kb.admin("POST", "/tenants/acme/admin-tokens", token=acme).status_code == 403
    # Only the hash of the tenant-admin token is stored.
    stored = (kb.settings.data_dir / "admin-tokens.json").read_text()
    assert acme not in stored and kb.admin_token not in stored


def test_placeholder_secrets_are_refused_outside_dev(tmp_path: Path) -> None:
    with pytest.raises(SettingsError):
        admin_token_hashes({"SEALED_BROKER_ADMIN_TOKEN": "changeme"})
    assert admin_token_hashes({"SEALED_BROKER_ADMIN_TOKEN": "changeme"}, dev=True)
    with pytest.raises(SettingsError):
        BrokerSettings(data_dir=tmp_path, keystore="vault", vault_url="http://x", vault_token="root")
    from key_broker.app import build_service

    # A plaintext master key (an older broker's, or one the operator planted) is refused at start.
    (tmp_path / "b").mkdir()
    _write(tmp_path / "b" / "master.key", "00" * 32)
    platform = tmp_path / "platform.pem"
    platform.write_bytes(Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    with pytest.raises(SettingsError, match="plaintext key files"):
        build_service(BrokerSettings(data_dir=tmp_path / "b", sim_platform_signing_key=platform))


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_rotation_rewraps_every_data_key_and_releases_continue(kb: Harness) -> None:
    keys = {
        v: kb.setup_tenant("acme", version=v, create_key=(v == "v1"), with_policy=(v == "v1"))
        for v in ("v1", "v2", "v3")
    }
    before = kb.admin("GET", "/tenants/acme").json()["data_keys"]
    assert {d["kek_version"] for d in before} == {1}
    r = kb.admin("POST", "/tenants/acme/key/rotate")
    assert r.json() == {"kek_version": 2, "rewrapped": 3}
    after = kb.admin("GET", "/tenants/acme").json()["data_keys"]
    assert {d["kek_version"] for d in after} == {2}
    kek = json.loads((kb.settings.data_dir / "keystore" / "tenants" / "acme" / "kek.json").read_text())
    assert set(kek["versions"]) == {"2"}  # the old KEK is retired once nothing needs it
    for version, key in keys.items():
        assert kb.obtain("acme", version=version).data_key == key


def test_revocation_stops_releases_and_running_workers_learn_it(kb: Harness) -> None:
    kb.setup_tenant("acme")
    released = kb.obtain("acme")
    assert check_key_status(kb.client, released, ModelRef("acme", "m", "v1")) == "active"
    kb.clock.advance(3600)  # the status check outlives the attestation token
    assert check_key_status(kb.client, released, ModelRef("acme", "m", "v1")) == "active"
    assert kb.admin("POST", "/tenants/acme/key/revoke").json()["revoked"] is True
    assert check_key_status(kb.client, released, ModelRef("acme", "m", "v1")) == "revoked"
    with pytest.raises(BrokerRefused):
        kb.obtain("acme")
    # A token of one scope cannot ask about another.
    assert check_key_status(kb.client, released, ModelRef("acme", "m", "v2")) == "revoked"


def test_signed_reference_values_extend_a_policy_and_are_verified_on_load(kb: Harness) -> None:
    kb.setup_tenant("acme", measurements=())
    signer = Ed25519PrivateKey.generate()
    pem = (
        signer.public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        .decode()
    )
    # Which keys may sign the tenant's reference values is the tenant's: the operator cannot pin one.
    path = "/tenants/acme/reference-value-keys/release-2026"
    assert kb.admin("PUT", path, json={"public_key_pem": pem}).status_code == 403
    own = refval_key_statement("acme", "release-2026", signer.public_key(), Ed25519PrivateKey.generate(), "acme-admin")
    assert kb.admin("PUT", path, json=own).status_code == 403  # signed by a key that is not the tenant's
    other = refval_key_statement("acme", "other-id", signer.public_key(), kb.policy_key("acme"), "acme-admin")
    assert kb.admin("PUT", path, json=other).status_code == 403  # a pin for another key id
    assert not (kb.settings.data_dir / "refvals" / "acme" / "keys").exists()
    assert [e["decision"] for e in kb.audit_entries() if e["action"] == "refval-key-add"] == ["deny"] * 3
    pin = refval_key_statement("acme", "release-2026", signer.public_key(), kb.policy_key("acme"), "acme-admin")
    assert kb.admin("PUT", path, json=pin).status_code == 201
    doc = sign_reference_values("acme", "prod", 1, [MEASUREMENT], signer, "release-2026")
    r = kb.admin("PUT", "/tenants/acme/reference-values", json=doc)
    assert r.status_code == 200 and r.json()["measurements"] == [MEASUREMENT]
    with pytest.raises(BrokerRefused):
        kb.obtain("acme")  # the policy does not reference the document yet
    kb.put_policy(
        "acme",
        {
            "policy_id": "acme-m",
            "version": 2,
            "tenant": "acme",
            "model": "m",
            "allowed_tee": ["sim"],
            "reference_values": "prod",
            "required_signer": SIGNER,
            "unsafe_allow_simulated_tee": True,
        },
    )
    assert kb.obtain("acme").receipt["receipt"]["policy_version"] == 2
    # Rollback, foreign signer and tampering are all refused.
    assert kb.admin("PUT", "/tenants/acme/reference-values", json=doc).status_code == 422
    forged = sign_reference_values(
        "acme", "prod", 5, ["ab" * 48], Ed25519PrivateKey.generate(), "release-2026"
    )
    assert kb.admin("PUT", "/tenants/acme/reference-values", json=forged).status_code == 422
    path = kb.settings.data_dir / "refvals" / "acme" / "docs" / "prod.json"
    tampered = json.loads(path.read_text())
    tampered["payload"]["measurements"] = ["ab" * 48]
    path.write_text(json.dumps(tampered))
    with pytest.raises(BrokerRefused):
        kb.obtain("acme")
    assert "StateTampered" in kb.last_denial()["reason"]  # caught by the state ledger before the signature


def test_receipts_are_fetched_and_verified_offline_with_the_cli(kb: Harness, tmp_path: Path) -> None:
    kb.setup_tenant("acme")
    token_ids = {kb.obtain("acme").token_id for _ in range(3)}
    body = kb.admin("GET", "/tenants/acme/receipts").json()
    assert {line["receipt"]["token_id"] for line in body["receipts"]} == token_ids
    receipts, pem = tmp_path / "r.jsonl", tmp_path / "broker.pem"
    receipts.write_text("".join(json.dumps(line) + "\n" for line in body["receipts"]))
    pem.write_text(kb.client.get("/v1/receipts/public-key").json()["public_key_pem"])
    cli = build_keys_cli()
    ok = CliRunner().invoke(
        cli, ["receipts", "--tenant", "acme", "--file", str(receipts), "--broker-key", str(pem), "--verify"]
    )
    assert ok.exit_code == 0, ok.output
    assert "3 receipts verified" in ok.output
    lines = receipts.read_text().splitlines()
    forged = json.loads(lines[0])
    forged["receipt"]["measurement"] = "ab" * 48
    receipts.write_text("\n".join([json.dumps(forged), *lines[1:]]) + "\n")
    bad = CliRunner().invoke(
        cli, ["receipts", "--tenant", "acme", "--file", str(receipts), "--broker-key", str(pem), "--verify"]
    )
    assert bad.exit_code == 1 and "INVALID" in bad.output


@pytest.mark.parametrize(
    ("path", "body", "status"),
    [
        ("/v1/attest", "not json", 422),
        ("/v1/attest", "[]", 422),
        (
            "/v1/attest",
            json.dumps({"session_id": "x", "tenant": "A", "model": "m", "version": "v", "evidence": {}}),
            422,
        ),
        (
            "/v1/attest",
            json.dumps(
                {"session_id": "x", "tenant": "a", "model": "m", "version": "v", "evidence": {"tee": "sim"}}
            ),
            400,
        ),
        ("/v1/key", json.dumps({"token": "x", "tenant": "a", "model": "m", "version": "v", "extra": 1}), 422),
        ("/v1/key/status", "{}", 422),
    ],
)
def test_malformed_input_gets_a_clear_4xx(kb: Harness, path: str, body: str, status: int) -> None:
    r = kb.client.post(path, content=body, headers={"content-type": "application/json"})
    assert r.status_code == status, r.text
    assert r.json()["error"]["type"] == "invalid_request"


def test_bodies_over_the_limit_are_refused_declared_or_chunked(kb: Harness) -> None:
    big = b"x" * ((1 << 20) + 1)
    assert kb.client.post("/v1/attest", content=big).status_code == 413

    def chunks():  # type: ignore[no-untyped-def]
        for _ in range(33):
            yield b"y" * 32768

    r = kb.client.post("/v1/attest", content=chunks(), headers={"content-type": "application/json"})
    assert r.status_code == 413


def test_rate_limits_per_client_and_per_worker_identity(harness_factory: Any) -> None:
    kb = harness_factory("limited", rate_limit_per_minute=5)
    other = bytes([7]) * 48
    kb.setup_tenant("acme", measurements=(MEASUREMENT, other.hex()))
    worker_a = kb.obtain("acme")
    polls = [
        kb.client.post(
            "/v1/key/status", json={"token": worker_a.token, "tenant": "acme", "model": "m", "version": "v1"}
        ).status_code
        for _ in range(6)
    ]
    assert polls == [200] * 5 + [429]
    # Status checks are limited per caller, not per the measurement a (public) token names: the
    # caller's budget is spent for every token. Workers renew leases instead, limited per attested
    # identity (tests/security/test_leases.py).
    worker_b = kb.obtain("acme", measurement=other)
    with pytest.raises(BrokerRateLimited):
        check_key_status(kb.client, worker_b, ModelRef("acme", "m", "v1"))
    # Challenges are limited per client address: 2 used above, 3 left.
    codes = [kb.client.post("/v1/challenge").status_code for _ in range(4)]
    assert codes == [200, 200, 200, 429]
    limited = kb.client.post("/v1/challenge")
    assert limited.headers.get("retry-after") == "1" and limited.json()["error"]["type"] == "rate_limited"
