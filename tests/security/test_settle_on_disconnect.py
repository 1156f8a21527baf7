"""#35: metering settles on disconnect, and no sealed decision record is lost with it.

A client that dropped a stream before its final frame was not metered (the usage record rides on
that frame), and its sealed request's decisions were lost (a cancelled call sends no trailers). Now
the worker keeps what such a call owed in a bounded outbox and delivers it with its next signed
heartbeats; the gateway stores usage once per (worker, request id) and audits records once per
(worker id, seq). Real worker servicer and gRPC, the real gateway service and heartbeat route."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from api.gateway.settings import GatewaySettings, WorkerRoute
from api.tenant_audit import read_sealed_decisions
from enclave_worker.guard import WorkerGuard
from enclave_worker.heartbeat import heartbeat_body
from enclave_worker.outbox import Outbox
from enclave_worker.settings import WorkerSettings
from enclave_worker.state import LiveState, WorkerState
from policy.audit import read_entries
from protocol.rpc import worker_pb2
from protocol.worker_status import Heartbeat
from tests.api.gateway_client import GatewayClient
from tests.security.sealed_harness import CLEAN_PROMPT, Stack, sealed_stack, tenant_policy
from tests.security.stand_in_engine import StandInEngine

REGISTER_TOKEN = "r" * 40


async def _owed(stack: Stack, items: int) -> None:
    """Until the worker's outbox holds `items` (the cancelled call has ended on the worker's side)."""
    for _ in range(2000):
        if len(stack.state.outbox) >= items:
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"the outbox holds {len(stack.state.outbox)} items, not {items}")


async def _beat(stack: Stack, seq: int) -> bool:
    """One heartbeat as the worker sends it, taken by the gateway as its route does."""
    batch = stack.state.outbox.batch()
    signed = json.loads(json.dumps(heartbeat_body(stack.state, stack.worker.grpc_address, "", seq, batch)))
    body = Heartbeat.model_validate(signed)
    stack.service.enrolment.heartbeat(body.model_dump(), signed)
    assert body.settle is not None
    settled = await stack.service.settle_owed(body.worker_id, body.settle)
    if settled:
        stack.state.outbox.settled(batch)
    return settled


async def test_a_sealed_stream_dropped_mid_answer_is_metered_and_its_record_delivered(tmp_path: Path) -> None:
    tenant_key = X25519PrivateKey.generate()
    engine = StandInEngine(tokens=5, release=asyncio.Event())
    async with sealed_stack(tmp_path, tenant_key, engine) as stack:
        _, request = stack.sealed(CLEAN_PROMPT, "rq1", stream=True)
        relay = stack.service.sealed_stream(stack.key, "m", request)
        assert (await anext(relay)).data  # the head and the first token
        await relay.aclose()  # the client leaves: the gateway cancels the call
        await _owed(stack, 2)
        assert stack.store.usage_summary("acme") == []  # no final frame came: nothing metered yet
        assert read_entries(tmp_path / "audit") == []
        assert await _beat(stack, 1)
        assert len(stack.state.outbox) == 0
        # The same batch again (a gateway that stored it but whose answer was lost): stored once.
        stack.state.outbox.owe_usage(stack.state.signer.usage(request, 1, 1, 0.0, 0.0))
        stack.state.outbox.owe_record(read_back(tmp_path))
        assert await _beat(stack, 2)
        await stack.service.usage_writer.close()
    (usage,) = stack.store.usage_summary("acme")
    assert usage["requests"] == 1 and usage["completion_tokens"] >= 1 and usage["prompt_tokens"] > 0
    assert engine.aborted == ["rq1-0"]  # the engine stopped at once, as before
    assert [r.action for r in read_entries(tmp_path / "audit")] == ["sealed-record"]
    report = read_sealed_decisions(tmp_path / "audit", "acme", tenant_key)
    assert [(r.request_id, r.seq) for r in report.records] == [("rq1", 1)] and not report.gaps


def read_back(tmp_path: Path) -> bytes:
    import base64

    return base64.b64decode(str(read_entries(tmp_path / "audit")[0].metadata["sealed_record"]))


async def test_a_plaintext_stream_dropped_mid_answer_owes_its_usage(tmp_path: Path) -> None:
    engine = StandInEngine(tokens=5, release=asyncio.Event())
    async with sealed_stack(tmp_path, None, engine) as stack:
        call = stack.stub.Generate(worker_pb2.GenerateRequest(
            request_id="rq9-0", tenant="acme", key_id="k", kind="chat",
            messages_json=json.dumps([{"role": "user", "content": CLEAN_PROMPT}])))
        assert (await call.read()).text == "ok"
        call.cancel()
        await _owed(stack, 1)
        owed = json.loads(stack.state.outbox.batch().usage[0].payload)
        assert (owed["request_id"], owed["completion_tokens"]) == ("rq9-0", 1)
        assert await _beat(stack, 1)
        await stack.service.usage_writer.close()
    assert [u["requests"] for u in stack.store.usage_summary("acme")] == [1]


async def test_a_completed_call_owes_nothing(tmp_path: Path) -> None:
    async with sealed_stack(tmp_path, X25519PrivateKey.generate()) as stack:
        _, request = stack.sealed(CLEAN_PROMPT, "rq1")
        [_ async for _ in stack.service.sealed_stream(stack.key, "m", request)]
        await asyncio.sleep(0.05)  # the call's done callback has run
        assert len(stack.state.outbox) == 0
    assert [r.action for r in read_entries(tmp_path / "audit")] == ["sealed-record"]


def test_the_heartbeat_route_settles_a_batch_once(tmp_path: Path) -> None:
    state = WorkerState(WorkerSettings(broker_url="", package_dir=tmp_path, tenant="acme", model="m",
                                       version="v1"), guard=WorkerGuard(tenant_policy(X25519PrivateKey.generate())),
                        live=LiveState(status="ready"))
    request = worker_pb2.SealedRequest(request_id="rq1", tenant="acme", key_id="k", model="m")
    state.outbox.owe_usage(state.signer.usage(request, 7, 3, 0.5, 1.0))
    state.outbox.owe_record(state.records.seal(request, (), 1.0) or b"")
    settings = GatewaySettings(data_dir=tmp_path / "gw", dev=True, register_token=REGISTER_TOKEN,
                               jwt_secret="j" * 40, workers=(WorkerRoute(tenant="acme", model="m", version="v1"),))
    (tmp_path / "gw").mkdir()
    with GatewayClient(settings) as client:
        for seq in (1, 2):  # the same batch twice (the first answer lost on the way back)
            body = heartbeat_body(state, "127.0.0.1:5001", "", seq, state.outbox.batch())
            reply = client.post("/internal/workers/heartbeat", json=body,
                                headers={"Authorization": f"Bearer {REGISTER_TOKEN}"})
            assert reply.status_code == 200 and reply.json()["settled"] is True, reply.text
        tampered = heartbeat_body(state, "127.0.0.1:5001", "", 3, state.outbox.batch())
        tampered["settle"]["usage"][0]["signature"] = "00" * 64  # the beat's own signature no longer covers it
        assert client.post("/internal/workers/heartbeat", json=tampered,
                           headers={"Authorization": f"Bearer {REGISTER_TOKEN}"}).status_code == 401
        store = client.service.store
    assert [(u["requests"], u["prompt_tokens"], u["completion_tokens"]) for u in store.usage_summary("acme")] == [
        (1, 7, 3)]
    actions = [r.action for r in read_entries(tmp_path / "audit")]
    assert actions.count("sealed-record") == 1 and "edge-refusal" in actions  # the tampered beat: 401


def test_the_outbox_is_bounded_and_forgets_only_what_was_settled() -> None:
    outbox = Outbox(max_items=3)
    for i in range(4):
        outbox.owe_record(bytes([i]))
    assert len(outbox) == 3 and outbox.dropped == 1
    batch = outbox.batch()
    assert batch.records == (b"\x01", b"\x02", b"\x03")
    outbox.owe_record(b"\x04")
    outbox.settled(batch)
    assert outbox.batch().records == (b"\x04",)
