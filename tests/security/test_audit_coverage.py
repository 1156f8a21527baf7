"""Finding 7 (#13): only the key broker wrote an audit log. Now one trail across roles, without
content: the gateway's admission refusals, the management API's changes, and the worker's
in-enclave decisions, signed inside the enclave with the worker's attested key, carried to the
gateway (gRPC trailing metadata), verified there against the pinned key and appended."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import openai
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from fastapi.testclient import TestClient

from api.app import build_gateway, create_app
from api.gateway.audit import audit_worker_decisions
from api.gateway.errors import GatewayError
from api.gateway.grpc_client import WorkerClients
from api.gateway.settings import GatewaySettings
from api.management.auth import issue_token
from api.stack import DEMO_MODEL
from api.store.db import make_engine, session_factory, upgrade
from api.store.repo import Store
from enclave_worker.guard import GuardRefusal, WorkerGuard
from policy.audit import AuditLog, read_entries, verify_dir
from policy.audit.worker_record import (
    DECISION_METADATA_KEY,
    DecisionRecordError,
    public_key_bytes,
    sign_decision,
    verify_logged_decision,
)
from policy.policyset import PolicySet
from protocol.rpc import worker_pb2, worker_pb2_grpc
from tests.api.conftest import stack  # noqa: F401 (the real `sealed up` stack fixture)

JWT_SECRET = "x" * 40


def _entries(audit_dir: Path, **filters: Any) -> list[Any]:
    return read_entries(audit_dir, **filters)


@pytest.fixture()
def store(tmp_path: Path) -> Store:
    engine = make_engine(f"sqlite:///{tmp_path / 'cp.db'}")
    upgrade(engine)
    return Store(session_factory(engine))


def test_gateway_admission_refusals_are_audited(store: Store, tmp_path: Path) -> None:
    store.ensure_tenant("acme", token_budget=1000)
    _, limited = store.create_key("acme", "limited", rpm=1)
    _, capped = store.create_key("acme", "capped", token_budget=0)
    service = build_gateway(GatewaySettings(data_dir=tmp_path / "gw", dev=True), store)
    try:
        service.admissions.ticket(limited, reserved_tokens=1)
        with pytest.raises(GatewayError):
            service.admissions.ticket(limited, reserved_tokens=1)  # rpm
        with pytest.raises(GatewayError):
            service.admissions.ticket(capped, reserved_tokens=1)  # key budget
    finally:
        service.audit.close()
    rows = _entries(tmp_path / "audit", component="gateway", decision="deny")
    assert [(r.action, r.metadata["limit"], r.metadata["key_id"]) for r in rows] == [
        ("admission", "rate", limited.key_id), ("admission", "key-budget", capped.key_id)]


def test_management_actions_are_audited_with_the_principal(tmp_path: Path) -> None:
    (tmp_path / "gw").mkdir()
    settings = GatewaySettings(data_dir=tmp_path / "gw", dev=True, jwt_secret=JWT_SECRET)
    app = create_app(settings)
    token = issue_token(JWT_SECRET, "alice@ops", "operator")
    headers = {"Authorization": f"Bearer {token}"}
    with TestClient(app) as client:
        assert client.post("/admin/v1/tenants", json={"name": "acme"}, headers=headers).status_code == 201
        key = client.post("/admin/v1/tenants/acme/keys", json={"name": "k"}, headers=headers).json()
        assert client.put(f"/admin/v1/tenants/acme/keys/{key['key_id']}/kill-switch", json={"killed": True},
                          headers=headers).status_code == 200
        assert client.post("/admin/v1/tenants/acme/models", json={"model": "m", "version": "v1"},
                           headers=headers).status_code == 201
        assert client.delete(f"/admin/v1/tenants/acme/keys/{key['key_id']}", headers=headers).status_code == 200
    rows = _entries(tmp_path / "audit", tenant="acme")
    assert [r.action for r in rows] == ["tenant-upsert", "api-key-create", "kill-switch", "model-version-upsert",
                                        "api-key-revoke"]
    assert all(r.metadata["principal"] == "alice@ops" and r.metadata["role"] == "operator" for r in rows)
    raw = "".join(p.read_text() for p in (tmp_path / "audit").glob("*.jsonl"))
    assert key["secret"] not in raw  # the key's secret is shown once, never logged


def _ssn_policy() -> PolicySet:
    return PolicySet.from_dict({"policy_id": "p", "version": 3, "tenant": "acme",
                                "data": {"pii_input": {"US_SSN": "block"}}})


def test_a_blocked_ssn_is_a_signed_verifiable_decision_without_content(tmp_path: Path) -> None:
    guard = WorkerGuard(_ssn_policy())
    with pytest.raises(GuardRefusal) as refusal:
        guard.check_input("key_1", "m", ["my SSN is 123-45-6789"])
    assert refusal.value.action == "content-input" and refusal.value.decision is not None
    worker_key = Ed25519PrivateKey.generate()
    d = refusal.value.decision
    payload, sig = sign_decision(worker_key, request_id="r1", tenant="acme", key_id="key_1", model="m",
                                 version="v1", action="content-input", decision="deny", rule=d.rule,
                                 policy_id=d.policy_id, policy_version=d.policy_version, at=1.0)
    record = worker_pb2.UsageRecord(payload=payload, signature=sig, public_key=public_key_bytes(worker_key))
    forged = worker_pb2.UsageRecord(payload=payload.replace(b'"deny"', b'"allow"'), signature=sig,
                                    public_key=public_key_bytes(worker_key))
    other = Ed25519PrivateKey.generate()
    p2, s2 = sign_decision(other, request_id="r1", tenant="acme", key_id="key_1", model="m", version="v1",
                           action="tool-call", decision="deny", rule="x", policy_id="p", policy_version=3, at=1.0)
    impostor = worker_pb2.UsageRecord(payload=p2, signature=s2, public_key=public_key_bytes(other))
    with AuditLog(tmp_path / "gateway.audit.jsonl", Ed25519PrivateKey.generate(), "gateway") as audit:
        n = audit_worker_decisions(audit, [record, forged, impostor], pinned_key_hex=public_key_bytes(worker_key).hex(),
                                   request_id="r1", tenant="acme", worker_id="w1")
    assert n == 1
    rows = read_entries(tmp_path / "gateway.audit.jsonl")
    assert [(r.action, r.decision) for r in rows] == [("worker-decision", "deny"), ("worker-decision-invalid", "deny"),
                                                      ("worker-decision-invalid", "deny")]
    fields = verify_logged_decision(rows[0])  # an auditor re-checks the worker's own signature
    assert fields["rule"] == d.rule and fields["policy_version"] == 3
    edited = rows[0].__class__(**{**rows[0].__dict__, "decision": "allow"})
    with pytest.raises(DecisionRecordError):
        verify_logged_decision(edited)
    assert "123-45" not in (tmp_path / "gateway.audit.jsonl").read_text()


class _RefusingWorker(worker_pb2_grpc.WorkerServicer):
    def __init__(self, record: worker_pb2.UsageRecord) -> None:
        self.record = record

    async def Generate(self, request, context):  # type: ignore[no-untyped-def]
        await context.abort(grpc.StatusCode.PERMISSION_DENIED, "request blocked by data policy (rule r)",
                            trailing_metadata=((DECISION_METADATA_KEY, self.record.SerializeToString()),))
        yield worker_pb2.GenerateChunk()  # pragma: no cover


async def test_the_signed_refusal_travels_in_grpc_trailing_metadata() -> None:
    key = Ed25519PrivateKey.generate()
    payload, sig = sign_decision(key, request_id="r", tenant="acme", key_id="k", model="m", version="v1",
                                 action="tool-call", decision="deny", rule="r", policy_id="p", policy_version=1, at=2.0)
    record = worker_pb2.UsageRecord(payload=payload, signature=sig, public_key=public_key_bytes(key))
    server = grpc.aio.server()
    worker_pb2_grpc.add_WorkerServicer_to_server(_RefusingWorker(record), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    clients = WorkerClients()
    try:
        with pytest.raises(GatewayError) as err:
            await clients.open(f"127.0.0.1:{port}", worker_pb2.GenerateRequest(request_id="r", tenant="acme"), 10)
        assert err.value.status == 403 and [r.payload for r in err.value.worker_decisions] == [payload]
    finally:
        await clients.close()
        await server.stop(None)


@pytest.fixture()
def client(stack: Any) -> Iterator[openai.OpenAI]:  # noqa: F811
    yield openai.OpenAI(base_url=f"{stack.url}/v1", api_key=stack.api_key, max_retries=0)


@pytest.mark.slow
def test_one_audit_trail_across_roles_through_the_real_stack(stack: Any, client: openai.OpenAI) -> None:  # noqa: F811
    marker = "zebra-quartz-7731"
    with pytest.raises(openai.PermissionDeniedError):
        client.chat.completions.create(model=DEMO_MODEL, max_tokens=8, messages=[
            {"role": "user", "content": f"{marker}: my social security number is 123-45-6789"}])
    tool = {"type": "function", "function": {
        "name": "delete_files", "description": "Delete files",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}}
    with pytest.raises(openai.PermissionDeniedError):
        client.chat.completions.create(model=DEMO_MODEL, max_tokens=32, temperature=0, tools=[tool],
                                       tool_choice={"type": "function", "function": {"name": "delete_files"}},
                                       messages=[{"role": "user", "content": "Clean up my home directory."}])
    audit_dir = stack.home / "audit"
    rows = read_entries(audit_dir, component="gateway")
    decisions = [r for r in rows if r.action == "worker-decision"]
    assert any(r.decision == "deny" and r.metadata["worker_action"] == "content-input" for r in decisions), rows
    assert any(r.decision == "deny" and r.metadata["worker_action"] == "tool-call" for r in decisions), rows
    for r in decisions:
        verify_logged_decision(r)  # signed in the enclave by the worker's attested usage key
    from api.cli.audit import load_component_keys

    reports = verify_dir(audit_dir, load_component_keys(audit_dir / "keys"))
    assert {r.component for r in reports} >= {"gateway", "key-broker"}
    for path in audit_dir.glob("*.jsonl"):
        text = path.read_text()
        assert marker not in text and "123-45" not in text and "home directory" not in text
        for line in text.splitlines():
            json.loads(line)
