"""`POST /v1/embeddings` through the real gateway app and its one request lifecycle, in front of a real
worker servicer over gRPC serving all-MiniLM-L6-v2 (encrypted by `encrypt_model`, decrypted in memory,
built by the worker's `build_engine`). The official openai SDK's `embeddings.create` gets
sentence-transformers' vectors within the engine's stated tolerance, as floats and as base64; bad
requests are refused with OpenAI's 400 and charge nothing."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from api.app import create_app
from api.tenant_tools import encrypt_model
from enclave_worker.boot import build_engine
from enclave_worker.engine.embedding_engine import EmbeddingEngine
from enclave_worker.package import decrypt_package
from enclave_worker.settings import WorkerSettings
from policy.audit import read_entries
from protocol.sealed import RequestContext, seal_request
from protocol.sealed.http import HEADER_KEY_ID, HEADER_MODEL, REQUEST_CONTENT_TYPE, ResponseHead
from tests.security.sealed_harness import CARD_PROMPT, CLEAN_PROMPT, SSN_PROMPT, Stack, sealed_stack
from tests.security.test_sealed_decisions_audited import OPAQUE_RUN

GOLDEN = json.loads((Path(__file__).parents[1] / "enclave_worker" / "engine" / "golden"
                     / "minilm_sentence_transformers.json").read_text())
FP32_TOLERANCE = 1e-5  # the engine's stated tolerance against sentence-transformers (docs/retrieval.md)
WANT = np.array(GOLDEN["embeddings"], dtype=np.float32)


@pytest.fixture(scope="module")
def encoder(minilm_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddingEngine]:
    pkg = tmp_path_factory.mktemp("encoder") / "pkg"
    encrypted = encrypt_model(minilm_dir, pkg, tenant="acme", model="m", version="v1",
                              signing_key=Ed25519PrivateKey.generate())
    settings = WorkerSettings(broker_url="http://b", package_dir=pkg, tenant="acme", model="m", version="v1",
                              num_threads=1)
    engine = build_engine(settings, decrypt_package(pkg, encrypted.data_key))
    assert isinstance(engine, EmbeddingEngine)
    yield engine
    asyncio.run(engine.shutdown())


@asynccontextmanager
async def _gateway(tmp_path: Path, engine: object) -> AsyncIterator[tuple[Stack, httpx.AsyncClient, str, str]]:
    """The gateway app in front of the worker; yields it with an HTTP client, the API key and its id."""
    tmp_path.mkdir(exist_ok=True)
    async with sealed_stack(tmp_path, None, engine=engine) as stack:  # type: ignore[arg-type]
        stack.worker.stats = stack.state.report().stats  # what the worker's heartbeats carry
        secret, key = stack.store.create_key("acme", "http")
        app = create_app(stack.service.settings, stack.service)
        # Building the app can outlast the heartbeat timeout on a loaded machine when its modules are
        # imported for the first time (this test run alone): the stand-in worker has just been seen.
        stack.worker.last_seen = stack.service.registry.clock.now()
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw", timeout=60,
                                     headers={"Authorization": f"Bearer {secret}"}) as client:
            yield stack, client, secret, key.key_id


def _sdk(client: httpx.AsyncClient, secret: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url="http://gw/v1", api_key=secret, http_client=client)


async def test_the_openai_sdk_gets_sentence_transformers_vectors(tmp_path: Path, encoder: EmbeddingEngine) -> None:
    async with _gateway(tmp_path, encoder) as (stack, client, secret, _):
        sdk = _sdk(client, secret)
        floats = await sdk.embeddings.create(model="m", input=GOLDEN["texts"], encoding_format="float")
        got = np.array([d.embedding for d in floats.data], dtype=np.float32)
        assert [d.index for d in floats.data] == list(range(8)) and floats.model == "m"
        assert np.abs(got - WANT).max() < FP32_TOLERANCE
        assert floats.usage.prompt_tokens == floats.usage.total_tokens > 8
        # The SDK's default asks for base64 and decodes it itself: the same vectors, bit for bit.
        default = await sdk.embeddings.create(model="m", input=GOLDEN["texts"])
        assert np.array_equal(np.array([d.embedding for d in default.data], dtype=np.float32), got)
        one = await sdk.embeddings.create(model="m", input="hello world", dimensions=384, user="u1")
        assert np.abs(np.array(one.data[0].embedding) - WANT[0]).max() < FP32_TOLERANCE
        # The signed usage was metered once per request.
        rows = stack.store.usage_summary("acme")
        assert sum(r["requests"] for r in rows) == 3
        assert sum(r["prompt_tokens"] for r in rows) == 2 * floats.usage.prompt_tokens + one.usage.prompt_tokens


async def test_base64_round_trip_and_token_ids(tmp_path: Path, encoder: EmbeddingEngine) -> None:
    ids = encoder.embedder.tokenize(["hello world"])[0]
    async with _gateway(tmp_path, encoder) as (_, client, _secret, _):
        r = await client.post("/v1/embeddings", json={"model": "m", "input": ["hello world"],
                                                      "encoding_format": "base64"})
        assert r.status_code == 200, r.text
        (row,) = [np.frombuffer(base64.b64decode(d["embedding"]), dtype="<f4") for d in r.json()["data"]]
        assert row.shape == (384,) and np.abs(row - WANT[0]).max() < FP32_TOLERANCE
        for given in (ids, [ids, ids]):  # one input as token ids; a list of them
            as_ids = await client.post("/v1/embeddings", json={"model": "m", "input": given})
            assert as_ids.status_code == 200, as_ids.text
            assert all(np.abs(np.array(d["embedding"]) - row).max() < FP32_TOLERANCE for d in as_ids.json()["data"])
            assert len(as_ids.json()["data"]) == (1 if given is ids else 2)
        mixed = await client.post("/v1/embeddings", json={"model": "m", "input": ["hello world", ids]})
        assert mixed.status_code == 400  # OpenAI's input is texts or id lists, not both


REFUSED = [  # (body change, what the 400 names)
    ({"input": ""}, "empty"),
    ({"input": []}, "empty"),
    ({"input": ["ok", ""]}, "input[1] is empty"),
    ({"input": ["ok"] * 2049}, "at most 2048"),
    ({"input": "word " * 400}, "maximum is 256"),
    ({"input": [101, 10**6, 102]}, "outside the vocabulary"),
    ({"input": [101, -1]}, "token id"),
    ({"dimensions": 256}, "dimensions 256"),
    ({"dimensions": 0}, "dimensions"),
    ({"encoding_format": "int8"}, "encoding_format"),
    ({"input": {"text": "x"}}, "input"),
    ({"extra": 1}, "extra"),
]


@pytest.mark.parametrize(("change", "named"), REFUSED, ids=[r[1] for r in REFUSED])
async def test_bad_requests_are_a_400_and_meter_nothing(tmp_path: Path, encoder: EmbeddingEngine, change: dict,
                                                        named: str) -> None:
    async with _gateway(tmp_path, encoder) as (stack, client, _, _):
        r = await client.post("/v1/embeddings", json={"model": "m", "input": "hello", **change})
        assert r.status_code == 400, r.text
        assert named in json.dumps(r.json()), r.text
        assert stack.store.usage_summary("acme") == []


async def test_wrong_model_kinds_are_a_clear_400(tmp_path: Path, encoder: EmbeddingEngine) -> None:
    async with _gateway(tmp_path / "chat", None) as (_, client, _secret, _):  # a chat model's worker
        r = await client.post("/v1/embeddings", json={"model": "m", "input": "hello"})
        assert r.status_code == 400 and "chat model" in r.json()["error"]["message"]
        assert r.json()["error"]["param"] == "model"
    async with _gateway(tmp_path / "embedding", encoder) as (_, client, _secret, _):
        r = await client.post("/v1/chat/completions", json={"model": "m", "max_tokens": 4,
                                                            "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 400 and "embedding model" in r.json()["error"]["message"]
        missing = await client.post("/v1/embeddings", json={"model": "nope", "input": "hello"})
        assert missing.status_code == 404


async def test_no_key_no_embeddings(tmp_path: Path, encoder: EmbeddingEngine) -> None:
    async with _gateway(tmp_path, encoder) as (_, client, _secret, _):
        r = await client.post("/v1/embeddings", json={"model": "m", "input": "hello"},
                              headers={"Authorization": "Bearer nope"})
        assert r.status_code == 401


async def _sealed_post(stack: Stack, client: httpx.AsyncClient, key_id: str, body: dict) -> tuple[list[bytes], bytes]:
    serving, endpoint = stack.state.serving_key, "/v1/embeddings"
    ctx = RequestContext("acme", "m", endpoint, serving.key_id, version="v1", api_key_id=key_id, policy_version=3)
    sealed = seal_request(serving.public_bytes, ctx, json.dumps(body).encode(), time.time())
    r = await client.post("/v1/sealed/embeddings", content=sealed.wire, headers={
        "content-type": REQUEST_CONTENT_TYPE, HEADER_MODEL: "m", HEADER_KEY_ID: serving.key_id})
    assert r.status_code == 200, r.text
    return [part for part, _ in sealed.opener.feed(r.content)], r.content


async def test_sealed_embeddings_answer_inside_the_worker(tmp_path: Path, encoder: EmbeddingEngine) -> None:
    async with _gateway(tmp_path, encoder) as (stack, client, _, key_id):
        texts = [f"quokka-5512 {t}" for t in GOLDEN["texts"][:2]]
        parts, wire = await _sealed_post(stack, client, key_id, {"model": "m", "input": texts})
        assert ResponseHead.decode(parts[0]).status == 200
        answer = json.loads(parts[1])
        got = np.array([d["embedding"] for d in answer["data"]], dtype=np.float32)
        want = encoder.embedder.embed(texts).vectors.numpy()
        assert got.shape == (2, 384) and np.abs(got - want).max() < FP32_TOLERANCE
        assert b"quokka" not in wire  # the gateway relayed ciphertext only
        rows = stack.store.usage_summary("acme")
        assert sum(r["prompt_tokens"] for r in rows) == answer["usage"]["prompt_tokens"] > 0
        # Refusals are sealed inner answers: a dimensions mismatch, an SSN under the tenant's policy.
        for body, status in (({"model": "m", "input": "hi", "dimensions": 3}, 400),
                             ({"model": "m", "input": "my SSN is 123-45-6789"}, 403)):
            parts, _ = await _sealed_post(stack, client, key_id, body)
            assert ResponseHead.decode(parts[0]).status == status, parts[1]


async def test_redactions_and_refusals_are_audited_with_the_workers_signature(
        tmp_path: Path, encoder: EmbeddingEngine) -> None:
    async with _gateway(tmp_path, encoder) as (_, client, _secret, _):
        card = await client.post("/v1/embeddings", json={"model": "m", "input": CARD_PROMPT})
        ssn = await client.post("/v1/embeddings", json={"model": "m", "input": SSN_PROMPT})
        clean = await client.post("/v1/embeddings", json={"model": "m", "input": CLEAN_PROMPT})
    assert (card.status_code, ssn.status_code, clean.status_code) == (200, 403, 200)
    rows = [r for r in read_entries(tmp_path / "audit") if r.reason != "management"]
    assert sorted((r.action, r.decision) for r in rows) == [("worker-decision", "deny"), ("worker-decision", "redact")]
    raw = "".join(p.read_text() for p in (tmp_path / "audit").glob("*.jsonl"))
    assert "quokka" not in raw and "4111" not in OPAQUE_RUN.sub("", raw)  # decisions, never content


async def test_sealed_redactions_and_refusals_go_to_the_tenants_sealed_record(
        tmp_path: Path, encoder: EmbeddingEngine, monkeypatch: pytest.MonkeyPatch) -> None:
    """As a sealed chat's: the worker's signed decisions go into the tenant's sealed record, none of
    them to the gateway's audit (it learns that a sealed request happened, not what was decided)."""
    async with _gateway(tmp_path, encoder) as (stack, client, _, key_id):
        recorded: dict[str, list[str]] = {}
        seal_record = stack.state.records.seal

        def keep(request: Any, decisions: Any, at: float) -> Any:
            recorded[request.request_id] = [json.loads(d.payload)["decision"] for d in decisions]
            return seal_record(request, decisions, at)

        monkeypatch.setattr(stack.state.records, "seal", keep)
        for prompt, status in ((CARD_PROMPT, 200), (SSN_PROMPT, 403), (CLEAN_PROMPT, 200)):
            parts, _ = await _sealed_post(stack, client, key_id, {"model": "m", "input": prompt})
            assert ResponseHead.decode(parts[0]).status == status, parts[1]
    assert sorted(map(tuple, recorded.values())) == [(), ("deny",), ("redact",)]
    rows = [r for r in read_entries(tmp_path / "audit") if r.reason != "management"]
    assert not [r for r in rows if r.action == "worker-decision"]
