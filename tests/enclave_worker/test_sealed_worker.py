"""The worker's side of sealed mode, without a model: what it refuses before anything runs."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import grpc
import pytest

from enclave_worker.guard import WorkerGuard
from enclave_worker.sealed import SealedRefusal, open_sealed_request
from enclave_worker.server import WorkerState
from enclave_worker.servicer import WorkerServicer
from enclave_worker.settings import WorkerSettings
from policy.policyset import PolicySet
from protocol.rpc import worker_pb2
from protocol.sealed import RequestContext, WorkerKey, seal_request


class Aborted(Exception):
    pass


class Context:
    code: Any = None

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        self.code, self.details = code, details
        raise Aborted(details)


def _state(require_sealed: bool = False) -> WorkerState:
    state = WorkerState(WorkerSettings(broker_url="http://b", package_dir=Path("/nonexistent"), tenant="acme",
                                       model="m", version="v1"))
    state.guard = WorkerGuard(PolicySet(policy_id="p", version=3, tenant="acme", require_sealed=require_sealed))
    state.booted = object()  # type: ignore[assignment]  # refusals come before the engine is touched
    return state


def test_signed_policy_require_sealed_makes_the_worker_refuse_plaintext() -> None:
    servicer, context = WorkerServicer(_state(require_sealed=True)), Context()

    async def run() -> None:
        async for _ in servicer.Generate(worker_pb2.GenerateRequest(tenant="acme", kind="chat"), context):
            pass

    with pytest.raises(Aborted):
        asyncio.run(run())
    assert context.code == grpc.StatusCode.PERMISSION_DENIED


def test_policy_set_round_trips_require_sealed() -> None:
    doc = PolicySet(policy_id="p", version=1, tenant="acme", require_sealed=True).to_dict()
    assert doc["require_sealed"] is True and PolicySet.from_dict(doc).require_sealed
    assert "require_sealed" not in PolicySet(policy_id="p", version=1, tenant="acme").to_dict()


def _sealed(state: WorkerState, *, key: WorkerKey | None = None, tenant: str = "acme", model: str = "m",
            endpoint: str = "/v1/chat/completions") -> worker_pb2.SealedRequest:
    key = key or state.serving_key
    ctx = RequestContext(tenant, model, endpoint, key.key_id)
    wire = seal_request(key.public_bytes, ctx, b'{"model": "m"}', time.time()).wire
    return worker_pb2.SealedRequest(request_id="r", tenant=tenant, key_id="k", model=model, endpoint=endpoint,
                                    worker_key_id=key.key_id, body=wire)


@pytest.mark.parametrize("case, code", [
    ("another worker's key", grpc.StatusCode.FAILED_PRECONDITION),
    ("another tenant", grpc.StatusCode.INVALID_ARGUMENT),
    ("another model", grpc.StatusCode.INVALID_ARGUMENT),
    ("unknown endpoint", grpc.StatusCode.INVALID_ARGUMENT),
    ("replayed", grpc.StatusCode.ALREADY_EXISTS),
    ("tampered", grpc.StatusCode.INVALID_ARGUMENT),
])
def test_sealed_request_refusals(case: str, code: grpc.StatusCode) -> None:
    state = _state()
    request = _sealed(state)
    if case == "another worker's key":
        request = _sealed(state, key=WorkerKey.generate())
    elif case == "another tenant":
        request = _sealed(state, tenant="globex")
    elif case == "another model":
        request = _sealed(state, model="n")
    elif case == "unknown endpoint":
        request = _sealed(state, endpoint="/v1/embeddings")
    elif case == "replayed":
        open_sealed_request(state, request)
    elif case == "tampered":
        request.body = request.body[:-1] + bytes([request.body[-1] ^ 1])
    with pytest.raises(SealedRefusal) as refused:
        open_sealed_request(state, request)
    assert refused.value.grpc_code == code


def test_a_well_formed_sealed_request_opens() -> None:
    state = _state()
    assert open_sealed_request(state, _sealed(state)).body == b'{"model": "m"}'
