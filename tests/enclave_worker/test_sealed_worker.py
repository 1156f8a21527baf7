"""The worker's side of sealed mode, without a model: what it refuses before anything runs."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from pathlib import Path
from typing import Any

import grpc
import pytest

from enclave_worker.cli import main as cli_main
from enclave_worker.guard import WorkerGuard
from enclave_worker.sealed import SealedRefusal, open_sealed_request
from enclave_worker.servicer import WorkerServicer
from enclave_worker.settings import WorkerSettings
from enclave_worker.state import LiveState, WorkerState
from policy.errors import PolicyInvalid
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
    # refusals come before the engine is touched
    return WorkerState(WorkerSettings(broker_url="http://b", package_dir=Path("/nonexistent"), tenant="acme",
                                      model="m", version="v1"),
                       guard=WorkerGuard(PolicySet(policy_id="p", version=3, tenant="acme",
                                                   require_sealed=require_sealed)),
                       live=LiveState.serving(object()))  # type: ignore[arg-type]


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
            endpoint: str = "/v1/chat/completions", api_key_id: str = "key_a", version: str = "",
            policy_version: int = 3) -> worker_pb2.SealedRequest:
    """A request as the client seals it (binding the API key id, version and policy version it
    verified) and the gateway relays it (naming `key_a` as the API key id)."""
    key = key or state.serving_key
    ctx = RequestContext(tenant, model, endpoint, key.key_id, version=version or state.settings.version,
                         api_key_id=api_key_id, policy_version=policy_version)
    wire = seal_request(key.public_bytes, ctx, b'{"model": "m"}', time.time()).wire
    return worker_pb2.SealedRequest(request_id="r", tenant=tenant, key_id="key_a", model=model, endpoint=endpoint,
                                    worker_key_id=key.key_id, body=wire)


@pytest.mark.parametrize("case, code", [
    ("another worker's key", grpc.StatusCode.FAILED_PRECONDITION),
    ("another tenant", grpc.StatusCode.INVALID_ARGUMENT),
    ("another model", grpc.StatusCode.INVALID_ARGUMENT),
    ("unknown endpoint", grpc.StatusCode.INVALID_ARGUMENT),
    ("replayed", grpc.StatusCode.ALREADY_EXISTS),
    ("tampered", grpc.StatusCode.INVALID_ARGUMENT),
    ("API key id relabelled by the gateway", grpc.StatusCode.INVALID_ARGUMENT),
    ("sealed for another model version", grpc.StatusCode.INVALID_ARGUMENT),
    ("sealed for another policy version", grpc.StatusCode.INVALID_ARGUMENT),
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
        request = _sealed(state, endpoint="/v1/moderations")
    elif case == "replayed":
        open_sealed_request(state, request)
    elif case == "tampered":
        request.body = request.body[:-1] + bytes([request.body[-1] ^ 1])
    elif case == "API key id relabelled by the gateway":  # another key's per-key rules would apply
        request.key_id = "key_b"
    elif case == "sealed for another model version":
        request = _sealed(state, version="v0")
    elif case == "sealed for another policy version":  # the worker enforces version 3
        request = _sealed(state, policy_version=2)
    with pytest.raises(SealedRefusal) as refused:
        open_sealed_request(state, request)
    assert refused.value.grpc_code == code


def test_a_well_formed_sealed_request_opens() -> None:
    state = _state()
    assert open_sealed_request(state, _sealed(state)).body == b'{"model": "m"}'


@pytest.mark.parametrize("call", ["Tokenize", "Detokenize"])
def test_require_sealed_refuses_every_call_that_carries_content(call: str) -> None:
    """#35: Tokenize takes a prompt and Detokenize gives text, both in clear: refused like Generate."""
    context = Context()
    request = (worker_pb2.TokenizeRequest(tenant="acme", kind="chat", messages_json="[]") if call == "Tokenize"
               else worker_pb2.DetokenizeRequest(tokens=[1, 2]))
    with pytest.raises(Aborted):
        asyncio.run(getattr(WorkerServicer(_state(require_sealed=True)), call)(request, context))
    assert context.code == grpc.StatusCode.PERMISSION_DENIED
    # Without the rule the same call gets past that check (and stops at the stand-in engine).
    with pytest.raises(AttributeError):
        asyncio.run(getattr(WorkerServicer(_state()), call)(request, Context()))


def test_the_policy_set_names_the_tenants_decision_record_key() -> None:
    key = "11" * 32
    doc = PolicySet(policy_id="p", version=1, tenant="acme", decision_record_key=key).to_dict()
    assert PolicySet.from_dict(doc).decision_record_key == key
    assert "decision_record_key" not in PolicySet(policy_id="p", version=1, tenant="acme").to_dict()
    for bad in ("11" * 31, "AB" * 32, "00" * 32, 42, "zz" * 32):
        with pytest.raises(PolicyInvalid):
            PolicySet.from_dict({"policy_id": "p", "version": 1, "tenant": "acme", "decision_record_key": bad})


def test_response_padding_is_a_measured_setting() -> None:
    def settings(**kw: Any) -> WorkerSettings:
        return WorkerSettings(broker_url="http://b", package_dir=Path("/x"), tenant="acme", model="m", version="v1",
                              **kw)

    assert settings().response_padding.min_bytes == 256
    assert settings(sealed_padding_min_bytes=1024).measured_config() != settings().measured_config()
    assert settings(sealed_padding_min_bytes=0).response_padding.bucket(10) == 10  # off: exact sizes
    for bad in (100, -1, 1 << 20):
        with pytest.raises(ValueError, match="sealed_padding_min_bytes"):
            settings(sealed_padding_min_bytes=bad)
    with pytest.raises(SystemExit):  # the flag: a clear usage error, not a traceback
        cli_main(["--broker-url", "b", "--package-dir", "/x", "--tenant", "t", "--model", "m", "--version", "v",
                  "--grpc-port", "1", "--sealed-padding-min-bytes", "300"])


async def test_the_worker_pads_response_chunks_to_its_setting() -> None:
    sizes = {}
    for min_bytes in (256, 4096):
        state = dataclasses.replace(_state(), settings=WorkerSettings(
            broker_url="http://b", package_dir=Path("/x"), tenant="acme", model="m", version="v1",
            sealed_padding_min_bytes=min_bytes))
        opened = open_sealed_request(state, _sealed(state))
        sizes[min_bytes] = len(opened.sealer.seal(b"a short token event"))
    assert sizes[4096] - sizes[256] == 4096 - 256
