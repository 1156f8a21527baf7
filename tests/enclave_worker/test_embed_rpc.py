"""`Worker.Embed` on a worker whose package is a sentence encoder: the package all-MiniLM-L6-v2
encrypted by `encrypt_model`, decrypted in memory and built by the worker's own `build_engine`, the
real servicer over real gRPC, the tenant's data controls. Vectors equal sentence-transformers'
(golden file) within the engine's stated tolerance; every bound refused with a typed status."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import grpc
import numpy as np
import pytest
import torch
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from api.tenant_tools import encrypt_model
from enclave_worker.boot import build_engine
from enclave_worker.clock import Clock
from enclave_worker.engine.embedding_engine import EmbeddingEngine, EmbeddingLimits
from enclave_worker.guard import WorkerGuard
from enclave_worker.package import decrypt_package
from enclave_worker.retrieval_rpcs import off_loop
from enclave_worker.servicer import WorkerServicer
from enclave_worker.settings import WorkerSettings
from enclave_worker.state import LiveState, WorkerState
from policy.audit.worker_record import DECISION_METADATA_KEY
from policy.policyset import PolicySet
from protocol.rpc import worker_pb2, worker_pb2_grpc

GOLDEN = json.loads((Path(__file__).parent / "engine" / "golden" / "minilm_sentence_transformers.json").read_text())
FP32_TOLERANCE = 1e-5  # the engine's stated tolerance against sentence-transformers (docs/retrieval.md)


@dataclass(frozen=True)
class FixedClock(Clock):
    def now(self) -> float:
        return 1_700_000_000.0


def _settings(package_dir: Path) -> WorkerSettings:
    return WorkerSettings(broker_url="http://b", package_dir=package_dir, tenant="acme", model="minilm",
                          version="v1", num_threads=1)


@pytest.fixture(scope="module")
def engine(minilm_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddingEngine]:
    pkg = tmp_path_factory.mktemp("encoder") / "pkg"
    encrypted = encrypt_model(minilm_dir, pkg, tenant="acme", model="minilm", version="v1",
                              signing_key=Ed25519PrivateKey.generate())
    built = build_engine(_settings(pkg), decrypt_package(pkg, encrypted.data_key))
    assert isinstance(built, EmbeddingEngine)  # the package's kind, not the caller, chose the encoder
    yield built
    asyncio.run(built.shutdown())


def _state(engine: Any) -> WorkerState:
    guard = WorkerGuard(PolicySet.from_dict({"policy_id": "p", "version": 3, "tenant": "acme", "data": {
        "pii_input": {"EMAIL_ADDRESS": "redact", "US_SSN": "block"}}}))
    booted = SimpleNamespace(engine=engine, model_digest="d" * 64,
                             released=SimpleNamespace(bundle=SimpleNamespace(digest=lambda: "e" * 64)))
    return WorkerState(_settings(Path("/nonexistent")), guard=guard, live=LiveState.serving(booted),  # type: ignore[arg-type]
                       clock=FixedClock())


@pytest.fixture
async def worker(engine: EmbeddingEngine) -> AsyncIterator[tuple[worker_pb2_grpc.WorkerStub, WorkerState]]:
    state = _state(engine)
    server = grpc.aio.server()
    worker_pb2_grpc.add_WorkerServicer_to_server(WorkerServicer(state), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        yield worker_pb2_grpc.WorkerStub(channel), state
    await server.stop(None)


def _request(*inputs: str | list[int], tenant: str = "acme") -> worker_pb2.EmbedRequest:
    return worker_pb2.EmbedRequest(request_id="rq1", tenant=tenant, key_id="k1", model="minilm", inputs=[
        worker_pb2.EmbedInput(text=i) if isinstance(i, str) else worker_pb2.EmbedInput(token_ids=i) for i in inputs])


def _vectors(reply: worker_pb2.EmbedReply) -> np.ndarray:
    return np.frombuffer(reply.vectors, dtype="<f4").reshape(-1, reply.dimensions)


async def test_embed_equals_sentence_transformers(worker: tuple[worker_pb2_grpc.WorkerStub, WorkerState]) -> None:
    stub, state = worker
    reply = await stub.Embed(_request(*GOLDEN["texts"]))
    assert reply.dimensions == 384
    got = _vectors(reply)
    assert got.shape == (8, 384)
    assert np.abs(got - np.array(GOLDEN["embeddings"], dtype=np.float32)).max() < FP32_TOLERANCE
    # The usage record is signed by the worker's usage key and counts the tokens the encoder read.
    usage = json.loads(reply.usage.payload)
    Ed25519PublicKey.from_public_bytes(reply.usage.public_key).verify(reply.usage.signature, reply.usage.payload)
    assert usage["prompt_tokens"] == reply.prompt_tokens > len(GOLDEN["texts"]) * 2
    assert (usage["request_id"], usage["tenant"], usage["completion_tokens"]) == ("rq1", "acme", 0)
    assert state.booted is not None and state.live.embedder is state.booted.engine.retrieval_encoder  # retrieval's


async def test_token_ids_embed_as_their_text(worker: tuple[worker_pb2_grpc.WorkerStub, WorkerState],
                                             engine: EmbeddingEngine) -> None:
    stub, _ = worker
    ids = engine.embedder.tokenize(["hello world"])[0]
    reply = await stub.Embed(_request(ids, "hello world"))
    a, b = _vectors(reply)
    assert np.abs(a - b).max() < FP32_TOLERANCE


async def test_redacted_input_is_embedded_redacted_and_the_decision_signed(
        worker: tuple[worker_pb2_grpc.WorkerStub, WorkerState]) -> None:
    stub, _ = worker
    text = "Write to me at ada@example.com about the weather."
    call = stub.Embed(_request(text))
    reply, trailers = await call, await call.trailing_metadata()
    assert [k for k, _ in trailers if k == DECISION_METADATA_KEY]
    plain = _vectors(await stub.Embed(worker_pb2.EmbedRequest(
        request_id="rq2", tenant="acme", key_id="k1", inputs=[worker_pb2.EmbedInput(text="the weather")])))
    assert not np.allclose(_vectors(reply), plain) and reply.prompt_tokens > 0


REFUSED = [  # (inputs, status, what the message names)
    ((), grpc.StatusCode.INVALID_ARGUMENT, "must not be empty"),
    (("",), grpc.StatusCode.INVALID_ARGUMENT, "input[0] is empty"),
    (("ok",) * 2049, grpc.StatusCode.INVALID_ARGUMENT, "at most 2048"),
    (("word " * 400,), grpc.StatusCode.INVALID_ARGUMENT, "maximum is 256"),
    (("ok", [101, 10**6, 102]), grpc.StatusCode.INVALID_ARGUMENT, "input[1] has a token id outside"),
    (("My SSN is 123-45-6789.",), grpc.StatusCode.PERMISSION_DENIED, "data policy"),
]


@pytest.mark.parametrize(("inputs", "status", "message"), REFUSED, ids=[r[2] for r in REFUSED])
async def test_bad_requests_are_refused(worker: tuple[worker_pb2_grpc.WorkerStub, WorkerState], inputs: tuple,
                                        status: grpc.StatusCode, message: str) -> None:
    stub, _ = worker
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.Embed(_request(*inputs))
    assert caught.value.code() == status and message in (caught.value.details() or "")
    if status == grpc.StatusCode.PERMISSION_DENIED:  # the refusal's signed decision, for the audit trail
        assert [k for k, _ in caught.value.trailing_metadata() or () if k == DECISION_METADATA_KEY]


async def test_another_tenant_and_both_input_forms_are_refused(
        worker: tuple[worker_pb2_grpc.WorkerStub, WorkerState]) -> None:
    stub, _ = worker
    for request, message in ((_request("hi", tenant="other"), "another tenant"),
                             (worker_pb2.EmbedRequest(tenant="acme", inputs=[
                                 worker_pb2.EmbedInput(text="hi", token_ids=[101, 102])]), "both text and token ids")):
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.Embed(request)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT and message in (caught.value.details() or "")


async def test_an_encoder_generates_nothing(worker: tuple[worker_pb2_grpc.WorkerStub, WorkerState]) -> None:
    stub, _ = worker
    call = stub.Generate(worker_pb2.GenerateRequest(request_id="rq1", tenant="acme", key_id="k1", kind="completion",
                                                    prompt="hello"))
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        async for _ in call:
            pass
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "embedding model" in (caught.value.details() or "")


async def test_a_chat_worker_refuses_embed() -> None:
    state = _state(SimpleNamespace(stats=lambda: {}))  # a decoder's worker: no encoder
    server = grpc.aio.server()
    worker_pb2_grpc.add_WorkerServicer_to_server(WorkerServicer(state), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await worker_pb2_grpc.WorkerStub(channel).Embed(_request("hi"))
    finally:
        await server.stop(None)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "not an embedding model" in (caught.value.details() or "")
    assert state.live.embedder is None


def test_the_request_token_bound(engine: EmbeddingEngine) -> None:
    small = EmbeddingEngine(engine.embedder, engine.tokenizer, engine._thread, EmbeddingLimits(max_request_tokens=10))
    small.check(["hello world"])  # 4 tokens with [CLS] and [SEP]
    with pytest.raises(Exception, match="at most 10 per request"):
        small.check(["hello world", "hello world", "hello world"])


def test_wipe_zeroes_the_encoder(minilm_dir: Path, tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    encrypted = encrypt_model(minilm_dir, pkg, tenant="acme", model="minilm", version="v1",
                              signing_key=Ed25519PrivateKey.generate())
    built = build_engine(_settings(pkg), decrypt_package(pkg, encrypted.data_key))
    held = built.held_tensors()
    assert held and any(bool(t.any()) for t in held)
    built.wipe()
    assert not any(bool(t.any()) for t in held if t.dtype != torch.bool)
    asyncio.run(built.shutdown())


def test_retrieval_embeds_on_the_compute_thread_as_embed_does(engine: EmbeddingEngine) -> None:
    # Chunks and queries of the vector stores are embedded where /v1/embeddings batches are (one
    # OpenMP team, under the engine's lock), not on the calling thread; the vectors are the same.
    texts = list(GOLDEN["texts"][:3])
    seen: list[threading.Thread] = []
    original = engine.embedder.embed

    def spy(inputs):  # type: ignore[no-untyped-def]
        seen.append(threading.current_thread())
        return original(inputs)

    engine.embedder.embed = spy  # type: ignore[method-assign]
    try:
        got = engine.retrieval_encoder.embed_texts(texts)
    finally:
        del engine.embedder.embed
    assert seen == [engine._thread.thread] and seen[0] is not threading.current_thread()
    assert np.abs(got - np.array(GOLDEN["embeddings"][:3], dtype=np.float32)).max() < FP32_TOLERANCE
    assert engine.retrieval_encoder.dim == engine.embedder.dim
    assert engine.retrieval_encoder.chunk_window == engine.embedder.chunk_window
    on_thread = engine._thread.call(lambda: engine.embed_waiting(texts))  # there already: no hop to wait on
    assert np.array_equal(on_thread.vectors.numpy(), got)


async def test_retrieval_calls_run_on_the_compute_thread(engine: EmbeddingEngine) -> None:
    # The whole call (open, embed, faiss) on the engine's compute thread: one hop from the loop, one
    # OpenMP team. An encoder without ``submit`` (one that computes on its caller's thread) keeps asyncio's pool.
    on_engine = SimpleNamespace(encoder=engine.retrieval_encoder, calls=threading.Lock())
    assert await off_loop(on_engine, threading.current_thread) is engine._thread.thread  # type: ignore[arg-type]
    elsewhere = SimpleNamespace(encoder=engine.embedder, calls=threading.Lock())
    ran_on = await off_loop(elsewhere, threading.current_thread)  # type: ignore[arg-type]
    assert ran_on is not engine._thread.thread and ran_on is not threading.current_thread()
