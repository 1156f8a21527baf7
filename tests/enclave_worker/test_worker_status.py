"""One WorkerStatus: /internal/status, the gRPC Status reply and the signed heartbeat all carry the
same model, built once by the worker (WorkerState.report) and validated by the gateway."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace

from fastapi.testclient import TestClient

from enclave_worker.heartbeat import heartbeat_body
from enclave_worker.server import create_app
from enclave_worker.servicer import WorkerServicer
from enclave_worker.settings import WorkerSettings
from enclave_worker.state import LiveState, WorkerState
from protocol.heartbeat import verify_heartbeat_signature
from protocol.rpc import worker_pb2
from protocol.worker_status import Heartbeat, WorkerStatus


def _state(tmp_path: Path) -> WorkerState:
    stats = {"num_running": 1, "num_waiting": 2, "kv_cache_usage_perc": 12.5}
    booted = SimpleNamespace(engine=SimpleNamespace(stats=lambda: stats), gpu_cc_off=False, load_s=1.25,
                             released=None, model_digest="")
    return WorkerState(WorkerSettings(broker_url="", package_dir=tmp_path, tenant="acme", model="m", version="v1"),
                       live=LiveState.serving(booted))  # type: ignore[arg-type]


def test_the_grpc_status_reply_is_the_worker_status(tmp_path: Path) -> None:
    state = _state(tmp_path)
    reply = asyncio.run(WorkerServicer(state).Status(worker_pb2.StatusRequest(), None))  # type: ignore[arg-type]
    assert reply.status == "ready"
    assert WorkerStatus.model_validate_json(reply.worker_status) == state.report()
    assert state.report().stats["num_waiting"] == 2 and state.report().load_s == 1.25


def test_internal_status_is_the_same_model(tmp_path: Path) -> None:
    state = _state(tmp_path)
    client = TestClient(create_app(state))  # a view: it boots nothing
    assert WorkerStatus.model_validate(client.get("/internal/status").json()) == state.report()


def test_the_heartbeat_is_the_worker_status_plus_identity(tmp_path: Path) -> None:
    state = _state(tmp_path)
    state.live.booted = None  # before boot: no attestation yet, still a valid heartbeat
    body = heartbeat_body(state, "127.0.0.1:7001", "", seq=1)
    beat = Heartbeat.model_validate(body)
    assert WorkerStatus.model_validate(beat.model_dump(include=set(WorkerStatus.model_fields))) == state.report()
    verify_heartbeat_signature(body)  # the gateway's check of exactly what was sent
