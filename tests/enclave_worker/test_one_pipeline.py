"""#34: plaintext and sealed requests take the same pipeline inside the worker (enclave_worker/answer.py),
so the same request gets the same answer either way: tokens, usage record, signed decisions.

A real (tiny, random-weight) engine, the real servicer over real gRPC, a fixed clock: the signed
records must then be equal byte for byte (Ed25519 signatures are deterministic). The decisions on a
sealed request reach only the tenant, in its sealed record (#35): opened here with the tenant's key,
they are the plaintext path's decisions, field for field."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import grpc
import pytest
import torch
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from api.tenant_audit import decision_key_public_hex
from enclave_worker.clock import Clock
from enclave_worker.engine import EngineConfig, LLMEngine
from enclave_worker.guard import WorkerGuard
from enclave_worker.servicer import WorkerServicer
from enclave_worker.settings import WorkerSettings
from enclave_worker.state import LiveState, WorkerState
from policy.audit.worker_record import DECISION_METADATA_KEY, public_key_bytes
from policy.policyset import PolicySet
from protocol.heartbeat import worker_id_for
from protocol.openai.chat import plan_chat
from protocol.openai.schemas import ChatCompletionRequest
from protocol.rpc import worker_pb2, worker_pb2_grpc
from protocol.sampling import DEFAULT_MAX_TOKENS
from protocol.sealed import RequestContext, seal_request
from protocol.sealed.decision_record import DECISION_FIELDS, RECORD_METADATA_KEY, open_decision_record
from protocol.sealed.http import ResponseHead

ENDPOINT = "/v1/chat/completions"
TENANT_KEY = X25519PrivateKey.generate()


@dataclass(frozen=True)
class FixedClock(Clock):
    def now(self) -> float:
        return 1_700_000_000.0

    def monotonic(self) -> float:
        return 42.0


@pytest.fixture(scope="module")
def engine() -> Iterator[LLMEngine]:
    from sealed_bench.gpu_models import random_checkpoint

    try:
        checkpoint = random_checkpoint("tiny", "cpu", torch.float32)
    except Exception as exc:  # the tokenizer comes from the installed default model
        pytest.skip(f"default model not installed: {exc}")
    # No prefix cache: the second path must recompute, not reuse the first one's KV blocks.
    yield LLMEngine.from_checkpoint(checkpoint, EngineConfig(max_num_seqs=2, kv_cache_memory_bytes=4 << 20,
                                                             num_threads=1, enable_prefix_caching=False))


def _state(engine: LLMEngine) -> WorkerState:
    guard = WorkerGuard(PolicySet.from_dict({"policy_id": "p", "version": 3, "tenant": "acme", "data": {
        "pii_input": {"EMAIL_ADDRESS": "redact", "US_SSN": "block"}},
        "decision_record_key": decision_key_public_hex(TENANT_KEY)}))
    booted = SimpleNamespace(engine=engine, model_digest="d" * 64,
                             released=SimpleNamespace(bundle=SimpleNamespace(digest=lambda: "e" * 64)))
    return WorkerState(WorkerSettings(broker_url="http://b", package_dir=Path("/nonexistent"), tenant="acme",
                                      model="m", version="v1"),
                       guard=guard, live=LiveState.serving(booted), clock=FixedClock())  # type: ignore[arg-type]


@dataclass
class Seen:
    """What one path gave back: the answer's text, tokens and usage, and the signed decisions."""

    status: int
    text: str = ""
    tokens: list[str] | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    usage: dict[str, Any] | None = None
    decisions: list[dict[str, Any]] | None = None


def _decisions(metadata: Any) -> list[dict[str, Any]]:
    """A plaintext call's signed decisions (trailers), as the fields a sealed record keeps of each."""
    fields = [json.loads(worker_pb2.UsageRecord.FromString(bytes(v)).payload)
              for k, v in (metadata or ()) if k == DECISION_METADATA_KEY]
    return [{k: f[k] for k in DECISION_FIELDS} for f in fields]


def _sealed_decisions(state: WorkerState, metadata: Any) -> list[dict[str, Any]]:
    """A sealed call's trailers hold no decision, only the tenant's record; the tenant opens it."""
    assert _decisions(metadata) == []
    (wire,) = [bytes(v) for k, v in metadata if k == RECORD_METADATA_KEY]
    usage_key = public_key_bytes(state.usage_key)
    record = open_decision_record(wire, TENANT_KEY, tenant="acme", worker_id=worker_id_for(usage_key),
                                  worker_key=usage_key)
    return [dict(d) for d in record.decisions]


async def _plaintext(stub: worker_pb2_grpc.WorkerStub, body: dict[str, Any]) -> Seen:
    """As the gateway sends it: the OpenAI layer's plan, one GenerateRequest per choice."""
    plan = plan_chat(ChatCompletionRequest.model_validate(body), rid="rq1", tenant="acme", key_id="k1",
                     agent_killed=False, default_max_tokens=DEFAULT_MAX_TOKENS)
    (request,) = plan.requests
    call = stub.Generate(request)
    chunks: list[worker_pb2.GenerateChunk] = []
    try:
        async for chunk in call:
            chunks.append(chunk)
    except grpc.aio.AioRpcError as exc:
        assert exc.code() == grpc.StatusCode.PERMISSION_DENIED
        return Seen(403, decisions=_decisions(exc.trailing_metadata()))
    last = chunks[-1]
    usage = json.loads(last.usage.payload)
    return Seen(200, "".join(c.text for c in chunks), [lp.token for c in chunks for lp in c.logprobs],
                last.prompt_tokens, last.completion_tokens, usage, _decisions(await call.trailing_metadata()))


async def _sealed(stub: worker_pb2_grpc.WorkerStub, state: WorkerState, body: dict[str, Any]) -> Seen:
    key = state.serving_key
    ctx = RequestContext("acme", "m", ENDPOINT, key.key_id, version="v1", api_key_id="k1", policy_version=3)
    sealed = seal_request(key.public_bytes, ctx, json.dumps(body).encode(), state.clock.now())
    call = stub.SealedGenerate(worker_pb2.SealedRequest(
        request_id="rq1", tenant="acme", key_id="k1", model="m", endpoint=ENDPOINT, worker_key_id=key.key_id,
        body=sealed.wire))
    plain, usage = [], None
    async for chunk in call:
        plain += [p for p, _ in sealed.opener.feed(chunk.data)]
        usage = json.loads(chunk.usage.payload) if chunk.HasField("usage") else usage
    decisions = _sealed_decisions(state, await call.trailing_metadata())
    status = ResponseHead.decode(plain[0]).status
    if status != 200:
        return Seen(status, decisions=decisions)
    answer = json.loads(plain[1])
    choice = answer["choices"][0]
    return Seen(200, choice["message"]["content"], [t["token"] for t in choice["logprobs"]["content"]],
                answer["usage"]["prompt_tokens"], answer["usage"]["completion_tokens"], usage, decisions)


@pytest.fixture
async def worker(engine: LLMEngine) -> AsyncIterator[tuple[worker_pb2_grpc.WorkerStub, WorkerState]]:
    state = _state(engine)
    server = grpc.aio.server()
    worker_pb2_grpc.add_WorkerServicer_to_server(WorkerServicer(state), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        yield worker_pb2_grpc.WorkerStub(channel), state
    await server.stop(None)


def _body(content: str) -> dict[str, Any]:
    return {"model": "m", "max_tokens": 6, "temperature": 0, "logprobs": True,
            "messages": [{"role": "user", "content": content}]}


async def test_an_answered_request_is_the_same_sealed_or_not(
        worker: tuple[worker_pb2_grpc.WorkerStub, WorkerState]) -> None:
    stub, state = worker
    body = _body("Write to me at ada@example.com about the weather.")  # redacted: a signed decision
    plaintext, sealed = await _plaintext(stub, body), await _sealed(stub, state, body)
    assert plaintext.status == sealed.status == 200
    assert plaintext.tokens and (plaintext.text, plaintext.tokens) == (sealed.text, sealed.tokens)
    assert (plaintext.prompt_tokens, plaintext.completion_tokens) == (sealed.prompt_tokens, sealed.completion_tokens)
    assert plaintext.usage is not None and sealed.usage is not None
    # One usage record each, alike but for the id: a choice's ("rq1-0") in plaintext, the whole request's sealed.
    assert (plaintext.usage.pop("request_id"), sealed.usage.pop("request_id")) == ("rq1-0", "rq1")
    assert plaintext.usage == sealed.usage
    assert plaintext.usage["completion_tokens"] == plaintext.completion_tokens > 0
    assert plaintext.decisions and plaintext.decisions == sealed.decisions  # the redaction, decided alike


async def test_a_refused_request_is_refused_alike_sealed_or_not(
        worker: tuple[worker_pb2_grpc.WorkerStub, WorkerState]) -> None:
    stub, state = worker
    body = _body("My SSN is 123-45-6789.")
    plaintext, sealed = await _plaintext(stub, body), await _sealed(stub, state, body)
    assert plaintext.status == sealed.status == 403
    assert plaintext.decisions and plaintext.decisions == sealed.decisions


async def test_the_first_answer_marks_the_first_token_phase_once(
        worker: tuple[worker_pb2_grpc.WorkerStub, WorkerState]) -> None:
    stub, state = worker
    state.cold_start.mark("load", 1.0, 2.0)  # loaded at t=2 (monotonic): the next phase runs from there
    assert "first_token" not in state.cold_start.spans
    assert (await _plaintext(stub, _body("Hello"))).status == 200
    # first_request: from the end of load to the request's arrival; first_token: from there to the token.
    arrived_from, arrived = state.cold_start.spans["first_request"]
    start, end = state.cold_start.spans["first_token"]
    assert arrived_from == 2.0 < arrived == start < end
    assert (await _sealed(stub, state, _body("Hello again"))).status == 200
    assert state.cold_start.spans["first_token"] == (start, end)  # the first answer only
    assert state.cold_start.stats()["sealed:cold_start_first_token_seconds"] == round(end - start, 4)
