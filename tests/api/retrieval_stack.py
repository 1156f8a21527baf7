"""The real gateway app (routes, store, audit) in front of one real worker servicer over real gRPC,
with the real encoder (all-MiniLM-L6-v2) and a data key as the broker would release it, for the
Files and Vector Stores API through the official openai SDK (docs/retrieval.md)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import grpc
import httpx
import openai
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from api.app import build_gateway, create_app
from api.gateway.service import GatewayService
from api.gateway.settings import GatewaySettings, WorkerRoute
from api.management.auth import issue_token
from api.store.repo import hash_secret
from enclave_worker.engine.embedder import Embedder
from enclave_worker.engine.encoder_checkpoint import load_encoder_dir
from enclave_worker.engine.layers.linear import LinearOptions
from enclave_worker.engine.models.options import BuildOptions
from enclave_worker.guard import WorkerGuard
from enclave_worker.servicer import WorkerServicer
from enclave_worker.settings import WorkerSettings
from enclave_worker.state import LiveState, WorkerState
from policy.documents import sign_policy_document
from policy.policyset import PolicySet
from policy.release_documents import public_pem
from protocol.rpc import worker_pb2_grpc
from tests.security.caller_harness import MODEL, TENANT, policy_doc, sim_document
from tests.security.harness import JWT_SECRET, REGISTER_TOKEN, heartbeat_doc
from tests.security.stand_in_engine import StandInEngine


@dataclass
class RetrievalStack:
    http: httpx.AsyncClient
    service: GatewayService
    state: WorkerState
    tenant_key: str  # the tenant's own key, listed in its signed caller policy
    reader_key: str  # another of its own keys, listed too (file_access may narrow what it reads)
    data_dir: Path
    servicer: WorkerServicer | None = None  # the worker's (its open stores: enclave_worker/retrieval/store_cache.py)

    def sdk(self, api_key: str | None = None) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url="http://gw/v1", api_key=api_key or self.tenant_key, max_retries=0,
                                  http_client=self.http)

    async def operator_key(self, tenant: str = TENANT) -> str:
        """A key the operator made through the management API (not in the tenant's caller policy)."""
        token = issue_token(JWT_SECRET, "ops", "operator")
        answer = await self.http.post(f"/admin/v1/tenants/{tenant}/keys", json={"name": "operator-made"},
                                      headers={"Authorization": f"Bearer {token}"})
        assert answer.status_code == 201, answer.text
        secret: str = answer.json()["secret"]
        return secret


@asynccontextmanager
async def retrieval_stack(tmp: Path, encoder: Embedder | None, *,
                          file_access: Callable[[str, str], dict[str, Any]] | None = None,
                          chat_engine: StandInEngine | None = None) -> AsyncIterator[RetrievalStack]:
    """``file_access``: the signed policy's section, given the digests of (tenant_key, reader_key);
    ``chat_engine``: the worker's stand-in chat model (a test may record the prompts it is given)."""
    data_dir = tmp / "gateway"
    data_dir.mkdir(exist_ok=True)
    settings = GatewaySettings(data_dir=data_dir, workers=(WorkerRoute(TENANT, MODEL, "v1"),),
                               register_token=REGISTER_TOKEN, jwt_secret=JWT_SECRET,
                               heartbeat_timeout_s=3600.0)  # one heartbeat: embedding on a busy CPU is slow
    service = build_gateway(settings)
    app = create_app(settings, service)
    tenant_key, _ = service.store.create_key(TENANT, "tenant-own")
    reader_key, _ = service.store.create_key(TENANT, "reader")
    admin = Ed25519PrivateKey.generate()
    doc = policy_doc({"api_keys": [hash_secret(tenant_key), hash_secret(reader_key)]})
    if file_access is not None:
        doc["file_access"] = file_access(hash_secret(tenant_key), hash_secret(reader_key))
    document = sign_policy_document(doc, admin, "tenant-admin")
    released = SimpleNamespace(bundle=SimpleNamespace(to_json=dict, digest=lambda: "e" * 64), token="t",
                               data_key=bytes(range(32)))
    booted = SimpleNamespace(engine=chat_engine or StandInEngine(), model_digest="d" * 64, released=released,
                             load_s=0.1, gpu_cc_off=False)
    state = WorkerState(WorkerSettings(broker_url="http://b", package_dir=Path("/nonexistent"), tenant=TENANT,
                                       model=MODEL, version="v1", host="127.0.0.1"),
                        guard=WorkerGuard(PolicySet.from_dict(document["payload"])),
                        live=LiveState.serving(booted))  # type: ignore[arg-type]
    server = grpc.aio.server(options=[("grpc.max_receive_message_length", 32 << 20)])
    servicer = WorkerServicer(state, encoder)
    worker_pb2_grpc.add_WorkerServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw",
                                     timeout=120) as http:
            tenant_admin = issue_token(JWT_SECRET, "alice", "tenant-admin", TENANT)
            answer = await http.put(f"/admin/v1/tenants/{TENANT}/policy",
                                    json={"document": document, "admin_key_pem": public_pem(admin.public_key())},
                                    headers={"Authorization": f"Bearer {tenant_admin}"})
            assert answer.status_code == 200, answer.text
            beat = await http.post("/internal/workers/heartbeat", json=heartbeat_doc(state, port),
                                   headers={"Authorization": f"Bearer {REGISTER_TOKEN}"})
            assert beat.status_code == 200, beat.text
            for worker in service.registry.workers.values():
                worker.attestation_doc = sim_document(state)
            yield RetrievalStack(http, service, state, tenant_key, reader_key, data_dir, servicer)
    finally:
        await service.close()
        await server.stop(None)


# The retrieval tests' shared fixtures, defined once: a module imports them (its pytest then offers
# them as "encoder" and "stack"; the imported names differ so that a test's parameter does not
# shadow an import).
@pytest.fixture(scope="module", name="encoder")
def encoder_fixture(minilm_dir: Path) -> Embedder:
    return Embedder(load_encoder_dir(minilm_dir), BuildOptions(LinearOptions(kernel="torch", in_place=True), 512))


@pytest.fixture(name="stack")
async def stack_fixture(tmp_path: Path, encoder: Embedder) -> AsyncIterator[RetrievalStack]:
    async with retrieval_stack(tmp_path, encoder) as running:
        yield running
