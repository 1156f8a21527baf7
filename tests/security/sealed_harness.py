"""A worker (real servicer, real gRPC, a stand-in engine) behind the real gateway service, with the
tenant's signed policy: SSNs refused, card numbers redacted (as `sealed up`'s demo tenant), and
decisions on sealed requests sealed to the tenant's decision-record key."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import grpc
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from api.app import build_gateway
from api.gateway.registry import WorkerInfo
from api.gateway.service import GatewayService
from api.gateway.settings import GatewaySettings
from api.store.db import make_engine, session_factory, upgrade
from api.store.repo import KeyRecord, Store
from api.tenant_audit import decision_key_public_hex
from enclave_worker.guard import WorkerGuard
from enclave_worker.servicer import WorkerServicer
from enclave_worker.settings import WorkerSettings
from enclave_worker.state import LiveState, WorkerState
from policy.audit.worker_record import public_key_bytes
from policy.policyset import PolicySet
from protocol.heartbeat import worker_id_for
from protocol.model_ref import ModelRef
from protocol.rpc import worker_pb2, worker_pb2_grpc
from protocol.sealed import RequestContext, SealedRequest, seal_request
from tests.security.stand_in_engine import StandInEngine

ENDPOINT = "/v1/chat/completions"
SSN_PROMPT = "quokka-5512: my SSN is 123-45-6789"
CARD_PROMPT = "quokka-5512: charge my card 4111 1111 1111 1111"
CLEAN_PROMPT = "quokka-5512: what is the capital of France?"


def tenant_policy(decision_key: X25519PrivateKey | None) -> PolicySet:
    doc: dict[str, Any] = {"policy_id": "p", "version": 3, "tenant": "acme",
                           "data": {"pii_input": {"US_SSN": "block", "CREDIT_CARD": "redact"}}}
    if decision_key is not None:
        doc["decision_record_key"] = decision_key_public_hex(decision_key)
    return PolicySet.from_dict(doc)


@dataclass
class Stack:
    state: WorkerState
    service: GatewayService
    store: Store
    key: KeyRecord
    worker: WorkerInfo
    stub: worker_pb2_grpc.WorkerStub
    engine: StandInEngine
    audit_dir: Path

    def sealed(self, content: str, request_id: str, stream: bool = False) -> tuple[SealedRequest,
                                                                                   worker_pb2.SealedRequest]:
        key = self.state.serving_key
        body = {"model": "m", "max_tokens": 4, "stream": stream, "messages": [{"role": "user", "content": content}]}
        guard = self.state.guard
        ctx = RequestContext("acme", "m", ENDPOINT, key.key_id, version="v1", api_key_id=self.key.key_id,
                             policy_version=guard.policy_set.version if guard and guard.policy_set else 0)
        sealed = seal_request(key.public_bytes, ctx, json.dumps(body).encode(), time.time())
        return sealed, worker_pb2.SealedRequest(request_id=request_id, tenant="acme", key_id=self.key.key_id,
                                                model="m", endpoint=ENDPOINT, worker_key_id=key.key_id,
                                                body=sealed.wire)


@asynccontextmanager
async def sealed_stack(tmp_path: Path, decision_key: X25519PrivateKey | None,
                       engine: StandInEngine | None = None,
                       guard_for: Callable[[str], WorkerGuard | None] | None = None) -> AsyncIterator[Stack]:
    """A gateway and a worker serving `engine`. The worker's tenant policy is `tenant_policy(decision_key)`,
    or what `guard_for` makes for the stack's API key id (None from it: no data controls)."""
    engine = engine or StandInEngine()
    db = make_engine(f"sqlite:///{tmp_path / 'cp.db'}")
    upgrade(db)
    store = Store(session_factory(db))
    _, key = store.create_key("acme", "k")
    released = SimpleNamespace(bundle=SimpleNamespace(to_json=dict, digest=lambda: "e" * 64),  # what a heartbeat
                               token="t",  # shows, and the evidence a receipt names
                               data_key=bytes(range(32)))  # stored responses are sealed under a key from it
    booted = SimpleNamespace(engine=engine, model_digest="d" * 64, released=released, load_s=0.1, gpu_cc_off=False)
    state = WorkerState(WorkerSettings(broker_url="http://b", package_dir=Path("/nonexistent"), tenant="acme",
                                       model="m", version="v1"),
                        guard=guard_for(key.key_id) if guard_for else WorkerGuard(tenant_policy(decision_key)),
                        live=LiveState.serving(booted))  # type: ignore[arg-type]
    server = grpc.aio.server()
    worker_pb2_grpc.add_WorkerServicer_to_server(WorkerServicer(state), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    (tmp_path / "gw").mkdir()
    service = build_gateway(GatewaySettings(data_dir=tmp_path / "gw", dev=True), store)
    usage_key = public_key_bytes(state.usage_key)
    worker = WorkerInfo(
        worker_id=worker_id_for(usage_key), grpc_address=f"127.0.0.1:{port}", ref=ModelRef("acme", "m", "v1"),
        status="ready", tee="sim", insecure=True, usage_public_key=usage_key.hex(),
        sealed_key_id=state.serving_key.key_id, last_seen=service.registry.clock.now())
    service.registry.workers[worker.worker_id] = worker
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            yield Stack(state, service, store, key, worker, worker_pb2_grpc.WorkerStub(channel), engine,
                        tmp_path / "audit")
    finally:
        await service.close()
        await server.stop(None)
