"""Finding 4 (#13): the broker's state on disk had no integrity.

Adding a measurement to `broker/policies/<tenant>/<model>.json` let a rogue measurement get a
token; setting `"revoked": false` in `kek.json` released the key again. Now every state file is
read through the MACed state ledger (key_broker/statefile.py) with a monotonic generation anchored
outside the data directory: an edited, planted, deleted or rolled-back file is refused, audited,
and nothing is released.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from key_broker.errors import SettingsError
from key_broker.statefile import StateTampered
from protocol.broker.errors import BrokerRefused
from tests.key_broker.conftest import Clock, Harness, bao_server  # noqa: F401 (fixture)

ROGUE = bytes(range(100, 148))


@pytest.fixture()
def kb(tmp_path: Path) -> Iterator[Harness]:
    harness = Harness(tmp_path / "kb", Clock())
    harness.setup_tenant("acme")
    yield harness
    harness.close()


def _integrity_denials(kb: Harness) -> list[dict[str, Any]]:
    return [e for e in kb.audit_entries() if e["action"] == "state-integrity" and e["decision"] == "deny"]


def test_measurement_added_to_a_policy_file_gets_no_token(kb: Harness) -> None:
    path = kb.settings.data_dir / "policies" / "acme" / "m.json"
    doc = json.loads(path.read_text())
    doc["payload"]["allowed_measurements"].append(ROGUE.hex())
    path.write_text(json.dumps(doc, sort_keys=True))
    with pytest.raises(BrokerRefused):
        kb.obtain("acme", measurement=ROGUE)
    with pytest.raises(BrokerRefused):  # and the legitimate worker is refused too: the file is untrusted
        kb.obtain("acme")
    assert "StateTampered" in kb.last_denial()["reason"]
    denial = _integrity_denials(kb)[-1]
    assert denial["tenant"] == "acme" and denial["metadata"]["file"] == "policies/acme/m.json"


def test_revocation_cannot_be_undone_by_editing_the_key_file(kb: Harness) -> None:
    released = kb.obtain("acme")
    assert kb.admin("POST", "/tenants/acme/key/revoke").status_code == 200
    path = kb.settings.data_dir / "keystore" / "tenants" / "acme" / "kek.json"
    doc = json.loads(path.read_text())
    assert doc["revoked"] is True
    doc["revoked"] = False
    path.write_text(json.dumps(doc, sort_keys=True))
    with pytest.raises(BrokerRefused):
        kb.obtain("acme")
    r = kb.client.post("/v1/key/status", json={"token": released.token, "tenant": "acme", "model": "m",
                                               "version": "v1"})
    assert r.status_code == 403 or r.json()["status"] == "revoked"  # fail closed: the worker wipes
    assert _integrity_denials(kb)


def test_a_file_put_back_from_an_older_copy_is_refused(kb: Harness) -> None:
    path = kb.settings.data_dir / "keystore" / "tenants" / "acme" / "kek.json"
    before = path.read_bytes()  # an older, validly recorded state (not revoked)
    assert kb.admin("POST", "/tenants/acme/key/revoke").status_code == 200
    path.write_bytes(before)  # rolled back
    with pytest.raises(BrokerRefused):
        kb.obtain("acme")
    assert "rolled back" in _integrity_denials(kb)[-1]["reason"]


def test_rolling_back_the_whole_data_directory_is_refused(kb: Harness, tmp_path: Path) -> None:
    data = kb.settings.data_dir
    snapshot = tmp_path / "snapshot"
    shutil.copytree(data, snapshot)  # before the revocation: ledger, key file and policies together
    assert kb.admin("POST", "/tenants/acme/key/revoke").status_code == 200
    kb.close()
    shutil.rmtree(data)
    shutil.copytree(snapshot, data)
    with pytest.raises(StateTampered, match="rolled back"):  # the anchor (outside the data dir) is ahead
        Harness(data.parent, Clock())


def test_a_rollback_under_a_running_broker_is_refused(kb: Harness, tmp_path: Path) -> None:
    data = kb.settings.data_dir
    ledger, kek = data / "state-ledger.json", data / "keystore" / "tenants" / "acme" / "kek.json"
    old = {p: p.read_bytes() for p in (ledger, kek)}
    assert kb.admin("POST", "/tenants/acme/key/revoke").status_code == 200
    for p, blob in old.items():
        (tmp_path / "t").write_bytes(blob)
        (tmp_path / "t").replace(p)
    with pytest.raises(BrokerRefused):
        kb.obtain("acme")
    assert "rolled back" in _integrity_denials(kb)[-1]["reason"]


def test_planted_state_files_are_refused(kb: Harness) -> None:
    data = kb.settings.data_dir
    # A policy for a model version the tenant never uploaded a policy for: version-specific wins.
    doc = json.loads((data / "policies" / "acme" / "m.json").read_text())
    doc["payload"]["allowed_measurements"] = [ROGUE.hex()]
    (data / "policies" / "acme" / "m@v1.json").write_text(json.dumps(doc))
    with pytest.raises(BrokerRefused):
        kb.obtain("acme", measurement=ROGUE)
    # A signing key for reference values, and a tenant-admin token hash.
    key = Ed25519PrivateKey.generate().public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    (data / "refvals" / "acme" / "keys").mkdir(parents=True, exist_ok=True)
    (data / "refvals" / "acme" / "keys" / "evil.pem").write_bytes(key)
    from key_broker.auth import hash_token

    (data / "admin-tokens.json").write_text(json.dumps({"evil": {
        "sha256": hash_token("skb_planted"), "role": "tenant-admin", "tenant": "acme", "created": "x",
        "revoked": False}}))
    r = kb.admin("POST", "/tenants/acme/key/rotate", token="skb_planted")
    assert r.status_code in (401, 403, 503) and r.status_code != 200
    files = {e["metadata"]["file"] for e in _integrity_denials(kb)}
    assert {"policies/acme/m@v1.json", "admin-tokens.json"} <= files


def test_a_deleted_file_is_refused_not_treated_as_absent(kb: Harness) -> None:
    (kb.settings.data_dir / "keystore" / "datakeys" / "acme" / "m" / "v1.json").unlink()
    with pytest.raises(BrokerRefused):
        kb.obtain("acme")
    assert "deleted" in _integrity_denials(kb)[-1]["reason"]


def test_state_from_before_the_ledger_is_not_trusted_silently(tmp_path: Path) -> None:
    kb = Harness(tmp_path / "kb", Clock())
    kb.setup_tenant("acme")
    kb.close()
    data = kb.settings.data_dir
    (data / "state-ledger.json").unlink()
    (tmp_path / "kb" / "audit" / "key-broker.state-anchor.json").unlink()
    with pytest.raises(SettingsError, match="unsafe-adopt-state"):
        Harness(tmp_path / "kb", Clock())
    adopted = Harness(tmp_path / "kb", Clock(), unsafe_adopt_state=True)
    try:
        assert adopted.obtain("acme").token_id
        assert any(e["action"] == "state-adopt" for e in adopted.audit_entries())
    finally:
        adopted.close()


def test_vault_mode_revocation_flag_deletion_is_refused(tmp_path: Path, bao_server: tuple[str, str]) -> None:  # noqa: F811
    kb = Harness(tmp_path / "vkb", Clock(), keystore="vault", vault_url=bao_server[0], vault_token=bao_server[1])
    try:
        kb.setup_tenant("vacme")
        kb.obtain("vacme")
        assert kb.admin("POST", "/tenants/vacme/key/revoke").status_code == 200
        (kb.settings.data_dir / "vault-state" / "revoked" / "vacme").unlink()
        with pytest.raises(BrokerRefused):
            kb.obtain("vacme")
        assert "deleted" in _integrity_denials(kb)[-1]["reason"]
        # The ledger's MAC key is a Transit key in OpenBao; the generation is also anchored there.
        data = kb.settings.data_dir
        assert json.loads((data / "state-ledger.json").read_text())["mac"].startswith("vault:")
    finally:
        kb.close()
