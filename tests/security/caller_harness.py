"""The real gateway app (routes, management API, metering) in front of one real worker servicer (real
gRPC, the tenant's signed policy in its guard, a stand-in engine), for the caller-policy and bill
attacks (issue #46, attack 5). The operator's management login is a JWT of role operator."""

from __future__ import annotations

import json
import os
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import grpc
import httpx
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from api.app import build_gateway, create_app
from api.gateway.service import GatewayService
from api.gateway.settings import GatewaySettings, WorkerRoute
from api.management.auth import issue_token
from api.store.repo import hash_secret
from attestation.bundle import EvidenceBundle, RuntimeData, channel_binding, expected_report_data
from attestation.sim import SimTee
from attestation.token import TokenIssuer
from attestation.workload import WorkloadClaims
from enclave_worker.guard import WorkerGuard
from enclave_worker.servicer import WorkerServicer
from enclave_worker.settings import WorkerSettings
from enclave_worker.state import LiveState, WorkerState
from policy.audit.worker_record import public_key_bytes
from policy.documents import sign_policy_document
from policy.policyset import PolicySet
from policy.release_documents import public_pem
from protocol.rpc import worker_pb2_grpc
from protocol.sealed import RequestContext, SealedRequest, api_key_id, seal_request
from protocol.sealed.caller import CallerCredential
from protocol.sealed.http import HEADER_KEY_ID, HEADER_MODEL, REQUEST_CONTENT_TYPE
from tests.security.harness import JWT_SECRET, REGISTER_TOKEN, heartbeat_doc
from tests.security.stand_in_engine import StandInEngine

TENANT, MODEL, ENDPOINT = "acme", "m", "/v1/chat/completions"


def policy_doc(callers: dict[str, Any] | None, version: int = 1) -> dict[str, Any]:
    doc: dict[str, Any] = {"policy_id": "p", "version": version, "tenant": TENANT,
                           "data": {"pii_input": {"US_SSN": "block"}}}
    if callers is not None:
        doc["callers"] = callers
    return doc


@dataclass
class Deployment:
    client: httpx.AsyncClient
    service: GatewayService
    state: WorkerState
    tenant_key: str  # the tenant's own API key (listed in its signed caller policy)
    admin_key: Ed25519PrivateKey  # the tenant's policy-admin key

    def operator_token(self) -> str:
        """The operator's management login."""
        return issue_token(JWT_SECRET, "ops", "operator")

    async def operator_key(self, tenant: str = TENANT) -> str:
        answer = await self.client.post(f"/admin/v1/tenants/{tenant}/keys", json={"name": "operator-made"},
                                        headers={"Authorization": f"Bearer {self.operator_token()}"})
        assert answer.status_code == 201, answer.text
        secret: str = answer.json()["secret"]
        return secret

    async def plaintext(self, api_key: str) -> httpx.Response:
        return await self.client.post("/v1/chat/completions", headers={"Authorization": f"Bearer {api_key}"},
                                      json={"model": MODEL, "max_tokens": 4,
                                            "messages": [{"role": "user", "content": "hello"}]})

    def seal(self, api_key: str, carried: CallerCredential | None = None) -> SealedRequest:
        """A sealed request as the tenant's client makes it with `api_key` (`carried`: the credential
        inside the envelope, when it is not that key's)."""
        key, guard = self.state.serving_key, self.state.guard
        ctx = RequestContext(TENANT, MODEL, ENDPOINT, key.key_id, version="v1", api_key_id=api_key_id(api_key),
                             policy_version=guard.policy_set.version if guard and guard.policy_set else 0)
        body = {"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "hello"}]}
        caller = (carried if carried is not None else CallerCredential(api_key=api_key)).encode()
        return seal_request(key.public_bytes, ctx, json.dumps(body).encode(), time.time(), caller=caller)

    async def sealed(self, api_key: str, carried: CallerCredential | None = None
                     ) -> tuple[httpx.Response, SealedRequest]:
        sealed = self.seal(api_key, carried)
        answer = await self.client.post(
            "/v1/sealed/chat/completions", content=sealed.wire,
            headers={"Authorization": f"Bearer {api_key}", "Content-Type": REQUEST_CONTENT_TYPE,
                     HEADER_MODEL: MODEL, HEADER_KEY_ID: self.state.serving_key.key_id})
        return answer, sealed


@asynccontextmanager
async def deployment(tmp: Path, callers: dict[str, Any] | None = None, *,
                     list_tenant_key: bool = True) -> AsyncIterator[Deployment]:
    """The gateway with the tenant's signed policy (uploaded through the management API, as the
    tenant admin does) and a worker enforcing the same signed policy. `callers`: its caller section
    (the tenant's own key is added to `api_keys` when `list_tenant_key`)."""
    (tmp / "gateway").mkdir(exist_ok=True)  # the data directory `sealed usage --home tmp` reads
    settings = GatewaySettings(data_dir=tmp / "gateway", workers=(WorkerRoute(TENANT, MODEL, "v1"),),
                               register_token=REGISTER_TOKEN, jwt_secret=JWT_SECRET)
    service = build_gateway(settings)
    app = create_app(settings, service)
    tenant_key, _ = service.store.create_key(TENANT, "tenant-own")
    section = dict(callers or {})
    if list_tenant_key:
        section["api_keys"] = [hash_secret(tenant_key), *section.get("api_keys", [])]
    admin = Ed25519PrivateKey.generate()
    document = sign_policy_document(policy_doc(section if callers is not None or list_tenant_key else None),
                                    admin, "tenant-admin")
    released = SimpleNamespace(bundle=SimpleNamespace(to_json=dict, digest=lambda: "e" * 64), token="t")
    booted = SimpleNamespace(engine=StandInEngine(), model_digest="d" * 64, released=released, load_s=0.1,
                             gpu_cc_off=False)
    state = WorkerState(WorkerSettings(broker_url="http://b", package_dir=Path("/nonexistent"), tenant=TENANT,
                                       model=MODEL, version="v1", host="127.0.0.1"),
                        guard=WorkerGuard(PolicySet.from_dict(document["payload"])),
                        live=LiveState.serving(booted))  # type: ignore[arg-type]
    server = grpc.aio.server()
    worker_pb2_grpc.add_WorkerServicer_to_server(WorkerServicer(state), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    transport = httpx.ASGITransport(app=app)
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://gw", timeout=60) as client:
            tenant_admin = issue_token(JWT_SECRET, "alice", "tenant-admin", TENANT)
            answer = await client.put(f"/admin/v1/tenants/{TENANT}/policy",
                                      json={"document": document, "admin_key_pem": public_pem(admin.public_key())},
                                      headers={"Authorization": f"Bearer {tenant_admin}"})
            assert answer.status_code == 200, answer.text
            beat = await client.post("/internal/workers/heartbeat", json=heartbeat_doc(state, port),
                                     headers={"Authorization": f"Bearer {REGISTER_TOKEN}"})
            assert beat.status_code == 200, beat.text
            for worker in service.registry.workers.values():  # what enrolment kept of its attestation
                worker.attestation_doc = sim_document(state)
            yield Deployment(client, service, state, tenant_key, admin)
    finally:
        await service.close()
        await server.stop(None)


# The simulated TEE's "hardware" key, which the tenant's client policy pins for these tests.
PLATFORM = Ed25519PrivateKey.generate()
MEASUREMENT = "ab" * 48


def sim_document(state: WorkerState, tenant: str = TENANT, usage_public: bytes | None = None) -> dict[str, Any]:
    """The worker's attestation document as the gateway keeps it: simulated evidence whose channel
    binding is over this worker's usage key (`usage_public`: another key, for the negative cases)."""
    usage = usage_public or public_key_bytes(state.usage_key)
    runtime = RuntimeData(nonce=os.urandom(32), hpke_public_key=state.serving_key.public_bytes,
                          channel_binding=channel_binding(b"", usage),
                          workload=WorkloadClaims(tenant, MODEL, "v1", "d" * 64, {}, policy_version=1).encode())
    report = SimTee(PLATFORM, bytes.fromhex(MEASUREMENT)).get_report(expected_report_data(runtime, ()))
    return {"tee": "sim", "insecure": True, "evidence": EvidenceBundle(tee="sim", cpu_evidence=report,
                                                                       runtime_data=runtime).to_json()}


def client_policy() -> dict[str, Any]:
    """The tenant's own client policy (what `sealed usage --verify --policy` reads)."""
    issuer = TokenIssuer(ec.generate_private_key(ec.SECP256R1()), "sealed-key-broker")
    platform = PLATFORM.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return {"tenant": TENANT, "evidence": {"sim_platform_key": platform.hex()},
            "appraisal": {"allowed_tee": ["sim"], "allowed_measurements": [MEASUREMENT],
                          "unsafe_allow_simulated_tee": True},
            "broker_jwks": issuer.jwks(),
            # Usage verification checks usage keys against hardware evidence; which release policy the
            # worker's key came under (the tenant-key pin, test_operator_attacks_tenant.py) is not under test.
            "unsafe_no_tenant_key": True}
