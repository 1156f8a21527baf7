"""Schemathesis against the gateway's and the management API's OpenAPI schemas (one app serves both),
in-process over ASGI, with real authentication: a bounded number of generated requests per
operation, none may answer 5xx, and every response must match its schema.

The worker behind the gateway is a stand-in speaking the real gRPC protocol (one chunk per choice,
whatever max_tokens asks), in a thread of its own: generated requests cost nothing to answer.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import grpc
import jwt
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_schema_conformance,
)

from api.app import build_gateway, create_app
from api.gateway.settings import GatewaySettings, WorkerRoute
from api.management.auth import AUDIENCE
from api.stack import free_port
from enclave_worker.settings import WorkerSettings
from enclave_worker.state import LiveState, WorkerState
from protocol.rpc import worker_pb2, worker_pb2_grpc
from tests.api.fake_worker import FakeServicer

EXAMPLES = 15  # per operation and generation mode (valid, invalid): about 1,000 requests in all
REGISTER, SECRET = "r" * 40, "j" * 40


class OneChunk(FakeServicer):
    async def Generate(self, request: worker_pb2.GenerateRequest, context: grpc.aio.ServicerContext
                       ) -> AsyncIterator[worker_pb2.GenerateChunk]:
        chunk = worker_pb2.GenerateChunk(text="ok", prompt_tokens=3, completion_tokens=1, finish_reason="length")
        chunk.usage.CopyFrom(self.state.signer.usage(request, 3, 1, 0.001, time.time()))
        yield chunk


def _worker_thread(state: WorkerState, port: int) -> threading.Event:
    started, stop = threading.Event(), threading.Event()

    async def run() -> None:
        server = grpc.aio.server()
        worker_pb2_grpc.add_WorkerServicer_to_server(OneChunk(state, 0.0), server)
        server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        started.set()
        while not stop.is_set():
            await asyncio.sleep(0.1)
        await server.stop(0)

    threading.Thread(target=asyncio.run, args=(run(),), daemon=True).start()
    started.wait(10)
    return stop


@pytest.fixture(scope="module")
def gateway_app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    from fastapi.testclient import TestClient

    from tests.security.harness import heartbeat_doc

    tmp = tmp_path_factory.mktemp("schemathesis")
    service = build_gateway(GatewaySettings(data_dir=tmp, workers=(WorkerRoute("acme", "m", "v1"),),
                                            register_token=REGISTER, jwt_secret=SECRET))
    app = create_app(service.settings, service)
    api_key, _ = service.store.create_key("acme", "schemathesis")
    port = free_port()
    state = WorkerState(WorkerSettings(broker_url="", package_dir=Path("."), tenant="acme", model="m",
                                       version="v1", host="127.0.0.1", port=port), live=LiveState(status="ready"))
    stop = _worker_thread(state, port)
    beating = threading.Event()

    def beat() -> None:  # the worker's heartbeats, through the app itself
        with TestClient(app) as client:
            while not beating.is_set():
                client.post("/internal/workers/heartbeat", json=heartbeat_doc(state),
                            headers={"Authorization": f"Bearer {REGISTER}"})
                time.sleep(0.5)

    threading.Thread(target=beat, daemon=True).start()
    time.sleep(1.0)
    now = dt.datetime.now(dt.UTC)
    operator = jwt.encode({"sub": "schemathesis", "role": "operator", "tenant": None, "aud": AUDIENCE, "iat": now,
                           "exp": now + dt.timedelta(hours=1), "jti": "schemathesis-operator"}, SECRET,
                          algorithm="HS256")
    yield {"app": app, "api_key": api_key, "operator": operator}
    beating.set()
    stop.set()


@pytest.fixture(scope="module")
def api_schema(gateway_app: dict):  # type: ignore[no-untyped-def]
    raw = gateway_app["app"].openapi()
    schema = schemathesis.openapi.from_dict(raw)
    schema = schema.exclude(path_regex=r"^/internal/")  # worker heartbeats: a worker credential, tested elsewhere
    # Logout, revocation and tenant removal end the fuzzer's own token or tenant (and every later
    # call): tests/api/test_session_revocation.py covers them.
    schema = schema.exclude(path_regex=r"^/admin/v1/(logout|revocations|sessions)$")
    return schema.exclude(method="DELETE", path_regex=r"^/admin/v1/tenants/\{tenant\}$")


def test_no_5xx_and_responses_match_the_schema(api_schema, gateway_app: dict) -> None:  # type: ignore[no-untyped-def]
    """Every operation, valid and invalid generated requests; all failures reported together."""
    failures: list[str] = []
    operations = [result.ok() for result in api_schema.get_all_operations()]
    assert len(operations) > 20

    def call(case, mode: GenerationMode) -> None:  # type: ignore[no-untyped-def]
        admin = case.path.startswith("/admin/")
        token = gateway_app["operator"] if admin else gateway_app["api_key"]
        if mode == GenerationMode.POSITIVE and isinstance(case.body, dict) and "model" in case.body and not admin:
            case.body["model"] = "m"  # reach the worker; random names are 404s
        case.call_and_validate(app=gateway_app["app"], headers={"Authorization": f"Bearer {token}"},
                               checks=[not_a_server_error, response_schema_conformance, content_type_conformance,
                                       negative_data_rejection])

    def runner(operation, mode: GenerationMode):  # type: ignore[no-untyped-def]
        @given(case=operation.as_strategy(generation_mode=mode))
        @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None,
                  phases=[Phase.explicit, Phase.generate])
        def run(case) -> None:  # type: ignore[no-untyped-def]
            call(case, mode)

        return run

    for operation in operations:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            try:
                runner(operation, mode)()
            except Unsatisfiable:
                assert mode == GenerationMode.NEGATIVE  # nothing in this operation can be made invalid
            except Exception as exc:
                failures.append(f"{operation.label} [{mode.value}]: {str(exc)[:1500]}")
    assert not failures, "\n\n".join(failures)
