"""An in-process gateway (the real ASGI app) with in-process stand-in workers speaking the real gRPC
protocol, for tests that need a precise worker behaviour (an error code, a slow stream)."""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import httpx
from cryptography.hazmat.primitives import serialization

from api.app import build_gateway, create_app
from api.gateway.service import GatewayService
from api.gateway.settings import GatewaySettings, WorkerRoute
from api.stack import free_port
from enclave_worker.settings import WorkerSettings
from enclave_worker.state import LiveState, WorkerState
from protocol.heartbeat import worker_id_for
from protocol.rpc import worker_pb2_grpc

REGISTER_TOKEN = "r" * 40
JWT_SECRET = "j" * 40


@dataclass
class InProcess:
    client: httpx.AsyncClient
    service: GatewayService
    api_key: str
    workers: list[str]  # worker ids
    states: list[WorkerState]

    def headers(self, key: str | None = None) -> dict[str, str]:
        return {"Authorization": f"Bearer {key or self.api_key}"}

    async def beat(self) -> None:
        """One heartbeat from every worker (what their loop sends each second)."""
        for state in self.states:
            await self.client.post("/internal/workers/heartbeat", json=heartbeat_doc(state),
                                   headers={"Authorization": f"Bearer {REGISTER_TOKEN}"})


_SEQ = itertools.count(1)


def heartbeat_doc(state: WorkerState, grpc_port: int | None = None) -> dict:
    """The worker's own signed heartbeat (enclave_worker.heartbeat.heartbeat_body)."""
    from enclave_worker.heartbeat import heartbeat_body

    return heartbeat_body(state, f"127.0.0.1:{grpc_port or state.settings.port}", "", next(_SEQ))


@contextlib.asynccontextmanager
async def gateway(tmp: Path, servicers: list, *, tenant: str = "acme", model: str = "m",
                  **settings: object) -> AsyncIterator[InProcess]:
    """`servicers`: callables state -> WorkerServicer; one worker each, all for (tenant, model, v1)."""
    gw_settings = GatewaySettings(data_dir=tmp, workers=(WorkerRoute(tenant, model, "v1"),),
                                  register_token=REGISTER_TOKEN, jwt_secret=JWT_SECRET, **settings)  # type: ignore[arg-type]
    service = build_gateway(gw_settings)
    app = create_app(gw_settings, service)
    secret, _ = service.store.create_key(tenant, "test")
    servers, states, ids = [], [], []
    for make in servicers:
        # Port 0, and no SO_REUSEPORT: the kernel's own free port, never shared with a listener some
        # earlier test left behind (a free_port() probe can be taken before the bind, and gRPC's default
        # SO_REUSEPORT would then split connections between the two servers silently).
        server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
        port = server.add_insecure_port("127.0.0.1:0")
        state = WorkerState(WorkerSettings(broker_url="", package_dir=Path("."), tenant=tenant, model=model,
                                           version="v1", host="127.0.0.1", port=port), live=LiveState(status="ready"))
        worker_pb2_grpc.add_WorkerServicer_to_server(make(state), server)
        await server.start()
        servers.append(server)
        states.append(state)
        public = state.usage_key.public_key().public_bytes(serialization.Encoding.Raw,
                                                           serialization.PublicFormat.Raw)
        ids.append(worker_id_for(public))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://gw", timeout=60) as client:
        harness = InProcess(client, service, secret, ids, states)
        await harness.beat()
        try:
            yield harness
        finally:
            for server in servers:
                await server.stop(0)
            await service.close()


@contextlib.asynccontextmanager
async def http_server(app: object, http: str = "auto", **limits: object) -> AsyncIterator[str]:
    """The app behind the gateway's real uvicorn configuration on 127.0.0.1 (`http`: its HTTP parser,
    httptools or h11; auto: as the gateway runs); yields its base URL."""
    import asyncio

    import uvicorn

    from api.http_server import ConnectionLimits, server_config

    port = free_port()
    server = uvicorn.Server(server_config(app, "127.0.0.1", port, ConnectionLimits(**limits),  # type: ignore[arg-type]
                                          http=http))  # type: ignore[arg-type]
    task = asyncio.create_task(server.serve())
    while not server.started:
        if task.done():
            task.result()
        await asyncio.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task
