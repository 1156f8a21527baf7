"""Issue #46, attack 3: the operator registers its own policy-admin key for a new tenant first.

The operator creates tenant `acme` at the broker, mints itself a tenant-admin token and registers
its own policy-admin key, then signs a release policy admitting its own worker image. The tenant
then follows docs/deploy.md: it encrypts its model, seals the data key to the broker and runs
`sealed models register --data-key`. Before #46 the command sent the key without checking whose
key governs the tenant, and the operator's image got the tenant's data key (seen on c92c9f1: the key
was stored and released to the operator's measurement).

Now a first key is bound only by answering the broker's invitation, and the operator can answer it
with its own key (the broker cannot tell whose key it is); the tenant's CLI asks the attested broker
which key governs the tenant before it sends anything, finds the operator's, and refuses.
"""

from __future__ import annotations

import datetime as dt
import json
import secrets
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import uvicorn
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from typer.testing import CliRunner

from api.cli.main import build
from api.home import ed25519_key
from api.ports import free_port
from enclave_worker.package.writer import write_package
from key_broker.measurement import simulated_measurement
from policy.release_documents import invitation_acceptance, public_pem, sign_release_policy
from protocol.broker.errors import BrokerRefused
from protocol.package.keywrap import seal_data_key
from tests.key_broker.conftest import MEASUREMENT, SIGNER, SIGNING_KEY, Clock, Harness

ROGUE = bytes(range(100, 148))  # the operator's own worker image


@pytest.fixture()
def served(tmp_path: Path) -> Iterator[tuple[Harness, str]]:
    clock = Clock()
    clock.now = dt.datetime.now(dt.UTC)  # the tenant's CLI checks invitations against its own clock
    kb = Harness(tmp_path / "kb", clock)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(kb.app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.02)
    try:
        yield kb, f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)
        kb.close()


def _tenant_env(monkeypatch: pytest.MonkeyPatch, url: str, home: Path, token: str) -> None:
    for name, value in {"SEALED_HOME": str(home), "SEALED_BROKER_URL": url, "SEALED_ADMIN_TOKEN": token,
                        "SEALED_BROKER_TENANT_TOKEN": token, "SEALED_MANAGEMENT_TOKEN": "m" * 40,
                        "SEALED_GATEWAY": "http://127.0.0.1:9"}.items():
        monkeypatch.setenv(name, value)


def broker_policy(kb: Harness, path: Path) -> Path:
    """What the tenant trusts: the broker build's measurement and the (simulated) platform's key."""
    key = serialization.load_pem_private_key(kb.broker_platform.read_bytes(), None)
    raw = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)  # type: ignore[union-attr]
    path.write_text(json.dumps({"evidence": {"sim_platform_key": raw.hex()},
                                "appraisal": {"unsafe_allow_simulated_tee": True},
                                "broker": {"tee": "sim", "measurements": [simulated_measurement(kb.settings).hex()]}}))
    return path


def tenant_files(kb: Harness, tmp_path: Path) -> tuple[Path, Path, bytes]:
    """The tenant's package and its data key sealed to the broker (`sealed encrypt`)."""
    data_key = secrets.token_bytes(32)
    pkg = tmp_path / "pkg"
    manifest = write_package(pkg, metadata={"config": {}}, tensors=[("w", torch.arange(8.0))], data_key=data_key,
                             key_id="k-acme", tenant="acme", model="m", version="v1", signing_key=SIGNING_KEY)
    public = serialization.load_pem_public_key(kb.client.get("/v1/import-key").json()["public_key_pem"].encode())
    sealed_file = tmp_path / "pkg.datakey.json"
    sealed_file.write_text(seal_data_key(data_key, manifest, public).to_json())  # type: ignore[arg-type]
    return pkg, sealed_file, data_key


def _register(pkg: Path, sealed_file: Path) -> Any:
    return CliRunner().invoke(build(), ["models", "register", "--tenant", "acme", "--model", "m", "--version", "v1",
                                        "--data-key", str(sealed_file), "--package", str(pkg)])


def _answer(url: str, tmp_path: Path, kb: Harness, invitation: dict) -> Any:
    key = tmp_path / "tenant-home" / "tenants" / "acme" / "policy-admin.pem"
    ed25519_key(key)
    (tmp_path / "invitation.json").write_text(json.dumps(invitation))
    return CliRunner().invoke(build(), ["keys", "admin-key", "--tenant", "acme", "--invitation",
                                        str(tmp_path / "invitation.json"), "--broker-policy",
                                        str(broker_policy(kb, tmp_path / "broker-policy.json")), "--url", url,
                                        "--home", str(tmp_path / "tenant-home")])


def test_operator_first_registration_gets_no_data_key(served: tuple[Harness, str], tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    kb, url = served
    # The operator: the tenant's key (its answer carries the invitation), a tenant-admin token of its
    # own making, and its own key answering the invitation first.
    created = kb.admin("POST", "/tenants/acme/key")
    assert created.status_code == 201
    invitation = created.json()["invitation"]
    operator_token = kb.admin("POST", "/tenants/acme/admin-tokens").json()["token"]
    operator_key = Ed25519PrivateKey.generate()
    statement = invitation_acceptance("acme", operator_key, "acme-admin", invitation["payload"])
    r = kb.admin("PUT", "/tenants/acme/policy-admin-key", token=operator_token, json=statement)
    assert r.status_code == 200, r.text  # the broker cannot tell whose key answered
    release = {"policy_id": "acme-m", "version": 1, "tenant": "acme", "model": "m", "allowed_tee": ["sim"],
               "allowed_measurements": [MEASUREMENT.hex(), ROGUE.hex()], "required_signer": SIGNER,
               "unsafe_allow_simulated_tee": True}
    assert kb.admin("PUT", "/tenants/acme/policies",
                    json=sign_release_policy(release, operator_key, "acme-admin")).status_code == 200

    # The tenant, on its own machine, as docs/deploy.md says: it answers the invitation it was given
    # (refused: used already), then registers its model with the data key.
    pkg, sealed_file, _ = tenant_files(kb, tmp_path)
    _tenant_env(monkeypatch, url, tmp_path / "tenant-home",
                kb.admin("POST", "/tenants/acme/admin-tokens").json()["token"])
    answered = _answer(url, tmp_path, kb, invitation)
    assert answered.exit_code != 0 and "NOT yours" in answered.output, answered.output
    result = _register(pkg, sealed_file)
    assert result.exit_code != 0
    assert "NOT yours" in result.output and "refusing to send anything for acme" in result.output, result.output
    assert kb.admin("GET", "/tenants/acme").json()["data_keys"] == [], result.output  # the key never left
    with pytest.raises(BrokerRefused):
        kb.obtain("acme", measurement=ROGUE)


def test_the_tenant_that_answers_its_invitation_registers_its_key(served: tuple[Harness, str], tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The control case: the tenant answers first; its key governs; the data key goes to the broker."""
    kb, url = served
    invitation = kb.admin("POST", "/tenants/acme/key").json()["invitation"]
    pkg, sealed_file, _ = tenant_files(kb, tmp_path)
    _tenant_env(monkeypatch, url, tmp_path / "tenant-home",
                kb.admin("POST", "/tenants/acme/admin-tokens").json()["token"])
    answered = _answer(url, tmp_path, kb, invitation)
    assert answered.exit_code == 0 and "attested by the pinned broker instance" in answered.output, answered.output
    pin = json.loads((tmp_path / "tenant-home" / "tenants" / "acme" / "broker-pin.json").read_text())
    assert pin["broker"]["instances"] == [kb.service.attested.identity.instance_id]  # type: ignore[union-attr]
    result = _register(pkg, sealed_file)
    assert "data key of acme/m/v1 is at the key broker" in result.output, result.output
    assert len(kb.admin("GET", "/tenants/acme").json()["data_keys"]) == 1
    # A rotation: the current key is checked first, then the pin names the new key.
    new_key = tmp_path / "new-admin.pem"
    ed25519_key(new_key)
    rotated = CliRunner().invoke(build(), ["keys", "admin-key", "--tenant", "acme", "--new-key", str(new_key),
                                           "--url", url, "--home", str(tmp_path / "tenant-home")])
    assert rotated.exit_code == 0, rotated.output
    pin = json.loads((tmp_path / "tenant-home" / "tenants" / "acme" / "broker-pin.json").read_text())
    assert pin["policy_admin_public_key_pem"] == public_pem(ed25519_key(new_key).public_key())
    assert "acme-admin-2" in CliRunner().invoke(build(), ["keys", "admin-key", "--tenant", "acme", "--admin-key",
                                                           str(new_key), "--url", url, "--home",
                                                           str(tmp_path / "tenant-home")]).output
    # A replay of the used invitation binds nothing more.
    again = invitation_acceptance("acme", Ed25519PrivateKey.generate(), "x", invitation["payload"])
    r = kb.admin("PUT", "/tenants/acme/policy-admin-key", token=kb.tenant_token("acme"), json=again)
    assert r.status_code == 403
    assert "used already" in [e for e in kb.audit_entries() if e["decision"] == "deny"][-1]["reason"]
