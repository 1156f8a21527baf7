"""Issue #46, attack 2: revocation undone by rolling the broker's data directory back.

The operator copies the broker's data directory before the tenant revokes its key, restores the copy
after, and deletes the state anchor file (outside the data directory) so that the ledger's older
generation has nothing to be compared with. Before #46 a missing anchor read as generation 0: the
broker started, showed the key not revoked and released it again (seen on c92c9f1: the first test
failed "DID NOT RAISE" and the revoked key was released). Now the start is refused, and a fresh
broker (`--init`) is another instance that pinned workers and tenants refuse.
"""

from __future__ import annotations

import datetime as dt
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from attestation.broker_identity import verify_broker_attestation
from attestation.errors import BrokerIdentityError
from enclave_worker.broker_auth import authenticate_broker, broker_trust
from enclave_worker.settings import WorkerSettings
from key_broker.__main__ import main
from key_broker.errors import SealedStateError, SettingsError
from key_broker.measurement import simulated_measurement
from key_broker.statefile import StateTampered
from protocol.broker.errors import BrokerNotAuthenticated
from protocol.exit_codes import EXIT_CONFIG_ERROR
from tests.key_broker.conftest import Clock, Harness


def test_a_restored_directory_without_its_anchor_does_not_start(tmp_path: Path) -> None:
    kb = Harness(tmp_path / "kb", Clock())
    kb.setup_tenant("acme")
    assert kb.obtain("acme").token_id
    data = kb.settings.data_dir
    snapshot = tmp_path / "snapshot"
    shutil.copytree(data, snapshot)  # taken before the revocation
    assert kb.admin("POST", "/tenants/acme/key/revoke").status_code == 200
    kb.close()
    shutil.rmtree(data)
    shutil.copytree(snapshot, data)
    (tmp_path / "kb" / "audit" / "key-broker.state-anchor.json").unlink()
    with pytest.raises(StateTampered, match="anchor"):
        restored = Harness(tmp_path / "kb", Clock())
        try:  # before #46: it started, the key was not revoked, and it was released again
            assert restored.obtain("acme").token_id
        finally:
            restored.close()


ANCHOR = Path("audit") / "key-broker.state-anchor.json"


@pytest.fixture()
def stopped(tmp_path: Path) -> Path:
    """A broker with a tenant, stopped; its root."""
    kb = Harness(tmp_path / "kb", Clock())
    kb.setup_tenant("acme", with_policy=False)
    kb.close()
    return tmp_path / "kb"


def _older_anchor(root: Path) -> None:
    """The anchor put back from a copy taken generations ago (a rollback prepared for later)."""
    doc = json.loads((root / ANCHOR).read_text())
    kb = Harness(root, Clock())
    kb.setup_tenant("other")  # the ledger moves on
    kb.close()
    (root / ANCHOR).write_text(json.dumps(doc))


@pytest.mark.parametrize(("spoil", "match"), [
    (lambda root: (root / ANCHOR).unlink(), "anchor .* is missing"),
    (lambda root: (root / ANCHOR).write_text("{not json"), "anchor .* unreadable"),
    (lambda root: (root / ANCHOR).write_text(json.dumps({"generation": 1})), "anchor .* unreadable"),
    (lambda root: (root / ANCHOR).write_text(json.dumps({"generation": 10**6, "mac": "00" * 32})),
     "does not authenticate"),
    (_older_anchor, "older than the ledger"),
])
def test_a_missing_unreadable_or_older_anchor_refuses_the_start(stopped: Path, spoil: Any, match: str) -> None:
    spoil(stopped)
    with pytest.raises(StateTampered, match=match):
        Harness(stopped, Clock())


def test_another_instances_anchor_refuses_the_start(stopped: Path, tmp_path: Path) -> None:
    """A fresh broker's anchor (another master key) does not authenticate for the restored one."""
    fresh = Harness(tmp_path / "fresh", Clock())
    fresh.close()
    shutil.copy(tmp_path / "fresh" / ANCHOR, stopped / ANCHOR)
    with pytest.raises(StateTampered, match="does not authenticate"):
        Harness(stopped, Clock())


def test_only_an_explicit_init_makes_a_broker(tmp_path: Path, stopped: Path) -> None:
    with pytest.raises(SealedStateError, match="--init"):  # no keys, no init: no broker
        Harness(tmp_path / "empty", Clock(), init=False)
    with pytest.raises(SettingsError, match="empty data directory"):  # init over a broker: nothing made
        Harness(stopped, Clock(), init=True)
    (stopped / "broker" / "broker-keys.sealed").unlink()  # keys gone, state files left
    with pytest.raises(SettingsError, match="empty data directory"):
        Harness(stopped, Clock(), init=True)


def _worker_settings(kb: Harness, instances: tuple[str, ...]) -> WorkerSettings:
    return WorkerSettings(broker_url="", package_dir=Path("."), tenant="acme", model="m", version="v1",
                          sim_platform_key=kb.broker_platform, broker_tee="sim",
                          broker_measurements=(simulated_measurement(kb.settings).hex(),), broker_instances=instances)


def test_an_initialised_broker_is_another_instance_that_pinned_parties_refuse(tmp_path: Path) -> None:
    """The operator's way around the refusal: a fresh broker (`--init`) in place of the restored one.
    It has a new instance key: the worker pinning the old instance refuses it, and so does the
    tenant's CLI (its broker pin)."""
    kb = Harness(tmp_path / "kb", Clock())
    old = kb.service.attested.identity.instance_id  # type: ignore[union-attr]
    assert authenticate_broker(_worker_settings(kb, (old,)), kb.client).identity.instance_id == old  # control
    kb.close()
    shutil.rmtree(tmp_path / "kb" / "broker")
    fresh = Harness(tmp_path / "kb", Clock())  # init: no keys in the data directory
    try:
        assert fresh.service.attested.identity.instance_id != old  # type: ignore[union-attr]
        with pytest.raises(BrokerNotAuthenticated, match="not the pinned one"):
            authenticate_broker(_worker_settings(fresh, (old,)), fresh.client)
        # `sealed verify --broker` / the tenant's CLI run the same check with the pinned instance.
        nonce = bytes(32)
        answer = fresh.client.post("/v1/broker/attestation", json={"nonce": nonce.hex()}).json()
        with pytest.raises(BrokerIdentityError, match="instance"):
            verify_broker_attestation(answer, nonce=nonce, now=dt.datetime.now(dt.UTC),
                                      trust=broker_trust(_worker_settings(fresh, ())),
                                      allowed_measurements=[simulated_measurement(fresh.settings).hex()],
                                      allowed_instances=[old])
    finally:
        fresh.close()


def test_the_broker_process_refuses_to_start_without_its_anchor(stopped: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    """`python -m key_broker` on the restored directory: one line, exit code 3, no server."""
    (stopped / ANCHOR).unlink()
    argv = ["--data-dir", str(stopped / "broker"), "--sim-platform-key", str(stopped / "sim.pub.pem"),
            "--sim-platform-signing-key", str(stopped / "broker-platform.pem")]
    assert main(argv) == EXIT_CONFIG_ERROR
    assert "refusing to start: StateTampered: state anchor" in capsys.readouterr().err
