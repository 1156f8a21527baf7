"""The client's tenant pin, policy-version memory and revocation list: the negative tables.

Each case is one attestation document (a stand-in worker on the simulated TEE speaking the real
formats, tests/security/tenant_pin_harness.py) with one thing wrong, checked as all three client
entry points check it (`verify_sealed_document`, with the session's memory and revocation list).
"""

from __future__ import annotations

import copy
import datetime as dt
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from attestation.token import TokenVerifier
from policy.release_documents import sign_release_policy
from policy.revocations import RevocationList, sign_revocation_list
from protocol.sealed.release_statement import ReleaseStatement, sign_release_statement
from sealed_client.deployment import ClientTrust, open_client_state, verify_sealed_document
from sealed_client.errors import ClientStateError, PolicyDowngrade, TenantPinError, WorkerRevoked
from sealed_client.memory import ClientMemory
from sealed_client.session import SealedSession
from tests.security.tenant_pin_harness import (
    GENUINE,
    MODEL,
    StandInWorker,
    TenantKeys,
    client_policy,
    genuine_issuer,
    raw,
)

NOW = lambda: dt.datetime.now(dt.UTC)  # noqa: E731


class World:
    def __init__(self, tmp_path: Path) -> None:
        self.issuer, self.tenant, self.platform = genuine_issuer(), TenantKeys(), Ed25519PrivateKey.generate()
        self.tmp = tmp_path

    def worker(self, version: int = 1, data_version: int = 1, **kw: Any) -> StandInWorker:
        worker = StandInWorker(self.platform, GENUINE, policy_version=data_version,
                               envelope=kw.pop("envelope", None) or self.tenant.release_policy(version=version), **kw)
        worker.attest_with(self.issuer)
        return worker

    def trust(self, **extra: Any) -> ClientTrust:
        return ClientTrust.from_dict(client_policy(self.platform, self.issuer.jwks(), self.tenant, **extra))

    def verify(self, doc: dict[str, Any], trust: ClientTrust | None = None, memory: ClientMemory | None = None,
               revocations: RevocationList | None = None) -> Any:
        trust = trust or self.trust()
        return verify_sealed_document(doc, TokenVerifier(self.issuer.jwks(), "sealed-key-broker"), trust, NOW(),
                                      model=MODEL, memory=memory, revocations=revocations)


def _resign_statement(worker: StandInWorker, doc: dict[str, Any], key: Ed25519PrivateKey | None = None,
                      **changes: Any) -> None:
    fields = {k: v for k, v in doc["release"]["statement"].items() if k != "v"}
    doc["release"] = sign_release_statement(ReleaseStatement(**{**fields, **changes}), doc["release"]["release_policy"],
                                            key or worker.usage)


def _bad_signature(w: StandInWorker, doc: dict) -> None:
    sig = doc["release"]["release_policy"]["sig"]
    doc["release"]["release_policy"]["sig"] = ("0" if sig[0] != "0" else "1") + sig[1:]


def _wrong_tenant_key(w: StandInWorker, doc: dict) -> None:
    """The operator's own key, under the tenant's key id; the statement re-signed to bind it (operator image)."""
    operator = Ed25519PrivateKey.generate()
    payload = doc["release"]["release_policy"]["payload"]
    doc["release"]["release_policy"] = sign_release_policy(payload, operator, "acme-admin")


def _unpinned_key_id(w: StandInWorker, doc: dict) -> None:
    doc["release"]["release_policy"]["key_id"] = "someone-else"


def _tampered_digest(w: StandInWorker, doc: dict) -> None:
    doc["release"]["release_policy"]["payload"]["allowed_measurements"] = [GENUINE, "cd" * 48]


def _statement_by_another_key(w: StandInWorker, doc: dict) -> None:
    _resign_statement(w, doc, Ed25519PrivateKey.generate())


def _statement_for_another_worker_key(w: StandInWorker, doc: dict) -> None:
    _resign_statement(w, doc, worker_key_id="0" * 64)


def _statement_stripped(w: StandInWorker, doc: dict) -> None:
    doc["release"] = None


def _statement_malformed(w: StandInWorker, doc: dict) -> None:
    doc["release"] = {"statement": "x", "signature": "00", "release_policy": {}}


def _other_policy_version_stated(w: StandInWorker, doc: dict) -> None:
    _resign_statement(w, doc, release_policy_version=7)


CASES: dict[str, tuple[Callable[[StandInWorker, dict], None], str]] = {
    "bad signature": (_bad_signature, "policy signature does not verify"),
    "wrong tenant key": (_wrong_tenant_key, "not signed by the pinned tenant key"),
    "key id not pinned": (_unpinned_key_id, "not a tenant key this client pins"),
    "tampered digest": (_tampered_digest, "digest differs"),
    "statement not by the receipt key": (_statement_by_another_key, "not signed by the worker's attested receipt key"),
    "statement for another worker key": (_statement_for_another_worker_key, "another tenant, model, version or worker"),
    "statement stripped": (_statement_stripped, "does not state under which tenant-signed release policy"),
    "statement malformed": (_statement_malformed, "release statement"),
    "statement names another version": (_other_policy_version_stated, "another policy id, version or signer"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_release_statement_negative_table(case: str, tmp_path: Path) -> None:
    world = World(tmp_path)
    worker = world.worker()
    doc = worker.document()
    world.verify(copy.deepcopy(doc))  # the control: as served, it verifies
    edit, why = CASES[case]
    edit(worker, doc)
    with pytest.raises(TenantPinError) as refused:
        world.verify(doc)
    assert why in str(refused.value)


def test_a_policy_for_another_model_or_image_is_refused(tmp_path: Path) -> None:
    world = World(tmp_path)
    other_model = sign_release_policy({"policy_id": "acme-x", "version": 1, "tenant": "acme", "model": "x",
                                       "allowed_tee": ["sim"], "allowed_measurements": [GENUINE],
                                       "unsafe_allow_simulated_tee": True}, world.tenant.admin, world.tenant.key_id)
    with pytest.raises(TenantPinError, match="another tenant or model"):
        world.verify(world.worker(envelope=other_model).document())
    not_this_image = world.tenant.release_policy(measurements=("cd" * 48,))
    with pytest.raises(TenantPinError, match="not one the tenant's signed release policy"):
        world.verify(world.worker(envelope=not_this_image).document())


def test_a_policy_without_a_tenant_key_is_refused_unless_unsafe(tmp_path: Path) -> None:
    world = World(tmp_path)
    doc = client_policy(world.platform, world.issuer.jwks(), None)
    with pytest.raises(ValueError, match="tenant_keys"):
        ClientTrust.from_dict(doc)
    assert ClientTrust.from_dict({**doc, "unsafe_no_tenant_key": True}).tenant_keys == {}
    with pytest.raises(TenantPinError):
        ClientTrust.from_dict({**doc, "tenant_keys": [{"key_id": "k", "public_key_pem": "not a key"}]})


# -- the memory of policy versions (attack 4)


@pytest.mark.parametrize(("seen", "then", "refused"), [
    ((2, 1), (1, 1), "release policy version 1"),  # an older release policy
    ((1, 2), (1, 1), "data policy version 1"),  # an older data policy
    ((2, 2), (2, 2), None),  # the same: accepted
    ((1, 1), (2, 3), None),  # newer: accepted (and remembered)
])
def test_older_versions_than_seen_are_refused(tmp_path: Path, seen: tuple[int, int], then: tuple[int, int],
                                              refused: str | None) -> None:
    world = World(tmp_path)
    memory = ClientMemory(ClientMemory.create(tmp_path / "state.json"))
    pin = world.verify(world.worker(*seen).document(), memory=memory)
    memory.record(pin.tenant, pin.model, pin.release.version, pin.policy_version)
    later = world.worker(*then).document()
    if refused is None:
        world.verify(later, memory=memory)
        return
    with pytest.raises(PolicyDowngrade, match=refused):
        world.verify(later, memory=memory)
    with pytest.raises(PolicyDowngrade, match=refused):  # and in the next session, from the state file
        world.verify(later, memory=ClientMemory(tmp_path / "state.json"))


@pytest.mark.parametrize(("content", "why"), [
    (None, "is missing"),
    (b"{not json", "cannot be read"),
    (b'{"v": 1}', "is not a version-1 client state"),
    (json.dumps({"v": 1, "release_policy_versions": {"acme/m": -1}, "data_policy_versions": {},
                 "reference_values_serial": 0, "revocations": None}).encode(), "non-negative"),
    (json.dumps({"v": 1, "release_policy_versions": {}, "data_policy_versions": {},
                 "reference_values_serial": "0", "revocations": None}).encode(), "malformed"),
])
def test_a_missing_or_corrupt_state_file_fails_closed(tmp_path: Path, content: bytes | None, why: str) -> None:
    """Named in the policy, the state file must be there and readable: no session starts, nothing is sent."""
    world = World(tmp_path)
    state = tmp_path / "client-state.json"
    if content is not None:
        state.write_bytes(content)
    trust = world.trust(state_file=str(state))
    with pytest.raises(ClientStateError, match=why):
        SealedSession(trust)
    with pytest.raises(ClientStateError, match=why):
        open_client_state(trust)


def test_two_sessions_sharing_a_state_file_only_move_forward(tmp_path: Path) -> None:
    path = ClientMemory.create(tmp_path / "state.json")
    first, second = ClientMemory(path), ClientMemory(path)
    first.record("acme", "m", 3, 2)
    second.record("acme", "m", 1, 1)  # a session that saw less must not write history back
    assert ClientMemory(path).release_versions == {"acme/m": 3} and ClientMemory(path).data_versions == {"acme": 2}
    assert ClientMemory.create(path) == path and ClientMemory(path).release_versions == {"acme/m": 3}  # kept


# -- revocations


def _revocations(world: World, serial: int, key: Ed25519PrivateKey | None = None, **lists: Any) -> dict[str, Any]:
    return sign_revocation_list(RevocationList(tenant="acme", serial=serial, **lists), key or world.tenant.admin,
                                world.tenant.key_id)


@pytest.mark.parametrize(("lists", "why"), [
    ({"revoked_release_policies": frozenset({("acme-m", 1)})}, "revoked release policy acme-m v1"),
    ({"revoked_data_keys": frozenset({"k-acme-m-v1"})}, "revoked the data key"),
])
def test_a_revoked_policy_or_data_key_is_refused(tmp_path: Path, lists: dict[str, Any], why: str) -> None:
    world = World(tmp_path)
    (tmp_path / "revocations.json").write_text(json.dumps(_revocations(world, 1, **lists)))
    trust = world.trust(revocations=str(tmp_path / "revocations.json"))
    _, revocations = open_client_state(trust)
    with pytest.raises(WorkerRevoked, match=why):
        world.verify(world.worker().document(), trust, revocations=revocations)
    world.verify(world.worker().document(), trust)  # the control: without the list it verifies


def test_a_revoked_admin_key_no_longer_signs(tmp_path: Path) -> None:
    world = World(tmp_path)
    second = Ed25519PrivateKey.generate()
    pins = [*world.tenant.pin(), {"key_id": "acme-admin-2",
                                  "public_key_pem": TenantKeys(second).pin()[0]["public_key_pem"]}]
    listed = sign_revocation_list(RevocationList(tenant="acme", serial=1, revoked_admin_keys=frozenset({"acme-admin"})),
                                  second, "acme-admin-2")
    (tmp_path / "revocations.json").write_text(json.dumps(listed))
    trust = world.trust(revocations=str(tmp_path / "revocations.json"), tenant_keys=pins)
    _, revocations = open_client_state(trust)
    with pytest.raises(TenantPinError, match="is revoked by the tenant"):
        world.verify(world.worker().document(), trust, revocations=revocations)


def test_a_revocation_list_not_signed_by_the_tenant_is_refused(tmp_path: Path) -> None:
    world = World(tmp_path)
    (tmp_path / "revocations.json").write_text(json.dumps(_revocations(world, 1, Ed25519PrivateKey.generate())))
    with pytest.raises(TenantPinError, match="revocation list does not verify"):
        SealedSession(world.trust(revocations=str(tmp_path / "revocations.json")))
    (tmp_path / "revocations.json").write_text("{")
    with pytest.raises(Exception, match="cannot be read"):
        SealedSession(world.trust(revocations=str(tmp_path / "revocations.json")))


def test_the_newest_revocation_list_is_kept_and_an_older_cannot_undo_it(tmp_path: Path) -> None:
    """The operator (or a restore of the client's policy folder) puts an older list back: the state
    file keeps the newest, so the revoked worker stays refused."""
    world = World(tmp_path)
    state = ClientMemory.create(tmp_path / "client-state.json")
    listed = tmp_path / "revocations.json"
    listed.write_text(json.dumps(_revocations(world, 5, revoked_data_keys=frozenset({"k-acme-m-v1"}))))
    trust = world.trust(state_file=str(state), revocations=str(listed))
    SealedSession(trust)
    listed.write_text(json.dumps(_revocations(world, 4)))  # older, revokes nothing
    session = SealedSession(trust)
    assert session.revocations is not None and session.revocations.serial == 5
    with pytest.raises(WorkerRevoked):
        world.verify(world.worker().document(), trust, revocations=session.revocations)
    assert json.loads(state.read_text())["revocations"]["payload"]["serial"] == 5


def test_a_revocation_list_added_to_a_session_drops_its_pins(tmp_path: Path) -> None:
    world = World(tmp_path)
    session = SealedSession(world.trust())
    worker = world.worker()
    session._jwks = world.issuer.jwks()
    session.pin_from(MODEL, {"workers": [worker.document()]})
    assert session.pinned(MODEL) is not None
    session.add_revocations(_revocations(world, 1, revoked_data_keys=frozenset({"k-acme-m-v1"})))
    assert session.pinned(MODEL) is None
    with pytest.raises(WorkerRevoked):
        session.pin_from(MODEL, {"workers": [worker.document()]})


def test_the_statement_is_bound_to_the_receipt_key(tmp_path: Path) -> None:
    """The receipt key that signs the statement is the one the evidence's channel binding covers."""
    world = World(tmp_path)
    worker = world.worker()
    pin = world.verify(worker.document())
    assert pin.receipt_key == raw(worker.usage) and pin.release.sha256 == worker.statement()["statement"][
        "release_policy_sha256"]


def test_the_tenant_signs_a_revocation_list_with_the_cli_and_its_client_applies_it(tmp_path: Path) -> None:
    """`sealed policies revocations`: offline, with the tenant's own key; a malformed entry is refused."""
    from cryptography.hazmat.primitives import serialization
    from typer.testing import CliRunner

    from api.cli.main import build

    world = World(tmp_path)
    key_file = tmp_path / "policy-admin.pem"
    key_file.write_bytes(world.tenant.admin.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                          serialization.NoEncryption()))
    out = tmp_path / "revocations.json"
    args = ["policies", "revocations", "--tenant", "acme", "--serial", "3", "--out", str(out), "--admin-key",
            str(key_file), "--key-id", world.tenant.key_id]
    bad = CliRunner().invoke(build(), [*args, "--revoke-release-policy", "acme-m"])
    assert bad.exit_code != 0 and not out.exists()
    result = CliRunner().invoke(build(), [*args, "--revoke-release-policy", "acme-m:1"])
    assert result.exit_code == 0, result.output
    trust = world.trust(revocations=str(out))
    _, revocations = open_client_state(trust)
    assert revocations is not None and revocations.serial == 3
    with pytest.raises(WorkerRevoked, match="acme-m v1"):
        world.verify(world.worker().document(), trust, revocations=revocations)
    world.verify(world.worker(version=2).document(), trust, revocations=revocations)  # v2 is not revoked
