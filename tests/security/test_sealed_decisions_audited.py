"""#13 audit gaps: in sealed mode the worker's in-enclave decisions (a guard refusal) were enforced
but not audited. Now they travel like plaintext-mode decisions: signed in the enclave with the
worker's attested key, as gRPC trailing metadata, verified by the gateway and appended to its audit
log, without content. Real worker servicer, real gRPC, the real gateway service."""

from __future__ import annotations

import json
import time
from pathlib import Path
from types import SimpleNamespace

import grpc
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from api.gateway.admission import AdmissionController
from api.gateway.audit import audit_worker_decisions
from api.gateway.limits import LocalQueueCounter
from api.gateway.registry import WorkerInfo
from api.gateway.service import GatewayService
from api.gateway.settings import GatewaySettings
from api.store.db import make_engine, session_factory, upgrade
from api.store.repo import Store
from enclave_worker.guard import WorkerGuard
from enclave_worker.server import WorkerState
from enclave_worker.servicer import WorkerServicer
from enclave_worker.settings import WorkerSettings
from policy.audit import AuditLog, read_entries
from policy.audit.worker_record import public_key_bytes, sign_decision, verify_logged_decision
from policy.limiter import TokenBucketLimiter
from policy.policyset import PolicySet
from protocol.model_ref import ModelRef
from protocol.rpc import worker_pb2, worker_pb2_grpc
from protocol.sealed import RequestContext, seal_request
from protocol.sealed.http import ResponseHead

MARK = "quokka-5512"


def _worker() -> WorkerState:
    state = WorkerState(WorkerSettings(broker_url="http://b", package_dir=Path("/nonexistent"), tenant="acme",
                                       model="m", version="v1"), status="ready")
    state.guard = WorkerGuard(PolicySet.from_dict({"policy_id": "p", "version": 3, "tenant": "acme",
                                                   "data": {"pii_input": {"US_SSN": "block"}}}))
    # The guard refuses before the engine is touched; the receipt names this digest.
    state.booted = SimpleNamespace(engine=object(), model_digest="d" * 64)  # type: ignore[assignment]
    return state


async def test_a_sealed_refusal_in_the_enclave_is_signed_relayed_and_audited_without_content(tmp_path: Path) -> None:
    state = _worker()
    server = grpc.aio.server()
    worker_pb2_grpc.add_WorkerServicer_to_server(WorkerServicer(state), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    engine = make_engine(f"sqlite:///{tmp_path / 'cp.db'}")
    upgrade(engine)
    store = Store(session_factory(engine))
    _, key = store.create_key("acme", "k")
    (tmp_path / "gw").mkdir()
    service = GatewayService(GatewaySettings(data_dir=tmp_path / "gw", dev=True), store,
                             AdmissionController(TokenBucketLimiter(), LocalQueueCounter(), 8, 8))
    usage_hex = public_key_bytes(state.usage_key).hex()
    service.registry.workers["w1"] = WorkerInfo(
        worker_id="w1", grpc_address=f"127.0.0.1:{port}", ref=ModelRef("acme", "m", "v1"), status="ready",
        tee="sim", insecure=True, usage_public_key=usage_hex, sealed_key_id=state.serving_key.key_id,
        last_seen=service.registry.clock.now())
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": f"{MARK}: my SSN is 123-45-6789"}]})
    ctx = RequestContext("acme", "m", "/v1/chat/completions", state.serving_key.key_id)
    sealed = seal_request(state.serving_key.public_bytes, ctx, body.encode(), time.time())
    request = worker_pb2.SealedRequest(request_id="rq1", tenant="acme", key_id=key.key_id, model="m",
                                       endpoint="/v1/chat/completions", worker_key_id=state.serving_key.key_id,
                                       body=sealed.wire)
    try:
        plain = []
        async for chunk in service.sealed_stream(key, "m", request):
            plain += [p for p, _ in sealed.opener.feed(chunk.data)]
    finally:
        await service.close()
        await server.stop(None)
    assert ResponseHead.decode(plain[0]).status == 403  # enforced, as before
    rows = read_entries(tmp_path / "audit")
    decisions = [r for r in rows if r.action == "worker-decision"]
    assert [(r.decision, r.metadata["worker_action"], r.tenant) for r in decisions] == [
        ("deny", "content-input", "acme")]
    fields = verify_logged_decision(decisions[0])  # an auditor re-checks the enclave's own signature
    assert fields["request_id"] == "rq1-0" and fields["policy_version"] == 3
    raw = "".join(p.read_text() for p in (tmp_path / "audit").glob("*.jsonl"))
    assert MARK not in raw and "123-45" not in raw


def test_sealed_decisions_must_name_that_request(tmp_path: Path) -> None:
    worker = Ed25519PrivateKey.generate()

    def record(request_id: str) -> worker_pb2.UsageRecord:
        payload, sig = sign_decision(worker, request_id=request_id, tenant="acme", key_id="k", model="m",
                                     version="v1", action="content-input", decision="deny", rule="r",
                                     policy_id="p", policy_version=1, at=1.0)
        return worker_pb2.UsageRecord(payload=payload, signature=sig, public_key=public_key_bytes(worker))

    records = [record("rq1-0"), record("rq1-x"), record("rq10-0"), record("rq2-0")]
    with AuditLog(tmp_path / "g.audit.jsonl", Ed25519PrivateKey.generate(), "gateway") as audit:
        sealed = audit_worker_decisions(audit, records, pinned_key_hex=public_key_bytes(worker).hex(),
                                        request_id="rq1", tenant="acme", worker_id="w", sealed=True)
        plaintext = audit_worker_decisions(audit, records[:1], pinned_key_hex=public_key_bytes(worker).hex(),
                                           request_id="rq1", tenant="acme", worker_id="w")
    assert (sealed, plaintext) == (1, 0)  # only a choice of that very request, and only in sealed mode
    actions = [r.action for r in read_entries(tmp_path / "g.audit.jsonl")]
    assert actions == ["worker-decision"] + ["worker-decision-invalid"] * 4
