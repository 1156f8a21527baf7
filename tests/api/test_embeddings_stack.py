"""`sealed up --embedding-model minilm`: all-MiniLM-L6-v2 encrypted like the demo model, its own
attested worker beside the chat model's; the official openai SDK's `embeddings.create` in plaintext
and through `SealedOpenAI` (a verified receipt) gets sentence-transformers' vectors within the
engine's stated tolerance. Its own stack (the session's `stack` serves no encoder)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from typing import Any as RunningStack

import httpx
import httpx2
import numpy as np
import openai
import pytest

from api.stack import DEMO_MODEL
from api.stack_embedding import EMBEDDING_MODEL
from protocol.sealed import ReceiptInvalid, ResponseCorrupted
from sealed_client import SealedOpenAI
from sealed_client.errors import UnsealedRequest
from tests.api.conftest import start_sealed_up, stop_sealed_up
from tests.api.sealed_helpers import demo_client_policy
from tests.policy.audit.stream.chaos import wait_until

GOLDEN = json.loads((Path(__file__).parents[1] / "enclave_worker" / "engine" / "golden"
                     / "minilm_sentence_transformers.json").read_text())
FP32_TOLERANCE = 1e-5  # the engine's stated tolerance against sentence-transformers (docs/retrieval.md)


@pytest.fixture(scope="module")
def embedding_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningStack]:
    running = start_sealed_up(tmp_path_factory.mktemp("embedding-stack"), args=("--embedding-model", "minilm"))

    def answers() -> bool:  # the encoder's worker attests and loads beside the chat model's
        r = httpx.post(f"{running.url}/v1/embeddings", json={"model": EMBEDDING_MODEL, "input": "x"}, timeout=30,
                       headers={"Authorization": f"Bearer {running.api_key}"})
        return r.status_code == 200

    wait_until(answers, "the embedding worker", lambda: running.proc.poll() is None)
    yield running
    if running.proc.poll() is None:
        stop_sealed_up(running)


def test_plaintext_and_sealed_embeddings_on_sealed_up(embedding_stack: RunningStack) -> None:
    stack = embedding_stack
    plain = openai.OpenAI(base_url=f"{stack.url}/v1", api_key=stack.api_key, max_retries=0)
    want = np.array(GOLDEN["embeddings"], dtype=np.float32)
    got = plain.embeddings.create(model=EMBEDDING_MODEL, input=GOLDEN["texts"])
    assert np.abs(np.array([d.embedding for d in got.data], dtype=np.float32) - want).max() < FP32_TOLERANCE
    sealed = SealedOpenAI(base_url=f"{stack.url}/v1", api_key=stack.api_key, max_retries=0,
                          policy=demo_client_policy(stack.home))
    answer = sealed.embeddings.create(model=EMBEDDING_MODEL, input=GOLDEN["texts"])
    assert np.abs(np.array([d.embedding for d in answer.data], dtype=np.float32) - want).max() < FP32_TOLERANCE
    assert answer.usage.prompt_tokens == got.usage.prompt_tokens
    receipt = sealed.sealed.receipts[-1]
    assert receipt.model == EMBEDDING_MODEL and receipt.prompt_tokens == got.usage.prompt_tokens
    # The chat model still answers chat, and each model refuses the other kind with a 400.
    with pytest.raises(openai.BadRequestError, match="chat model"):
        plain.embeddings.create(model=DEMO_MODEL, input="x")
    with pytest.raises(openai.BadRequestError, match="embedding model"):
        plain.chat.completions.create(model=EMBEDDING_MODEL, messages=[{"role": "user", "content": "hi"}])


CONTRACT = ("The supplier contract with Quokka Freight ends on 31 March 2029 and renews for one year "
            "unless either side gives ninety days' notice.")
HOLIDAYS = "Staff take 25 days of paid holiday a year; unused days carry over until the end of March."


def test_files_and_vector_stores_on_sealed_up(embedding_stack: RunningStack) -> None:
    """The Files and Vector Stores APIs against `sealed up`: the encoder's worker seals, chunks, embeds
    and indexes the documents; the stack's disk keeps no document text."""
    stack = embedding_stack
    plain = openai.OpenAI(base_url=f"{stack.url}/v1", api_key=stack.api_key, max_retries=0)
    uploaded = plain.files.create(file=("holidays.txt", HOLIDAYS.encode()), purpose="assistants")
    store = plain.vector_stores.create(name="handbook")
    attached = plain.vector_stores.files.create_and_poll(vector_store_id=store.id, file_id=uploaded.id)
    contract = plain.vector_stores.files.upload_and_poll(vector_store_id=store.id,
                                                          file=("contract.txt", CONTRACT.encode()))
    assert attached.status == "completed" and contract.status == "completed"
    page = plain.vector_stores.search(store.id, query="When does the supplier contract end?", max_num_results=2)
    assert page.data[0].file_id == contract.id and "31 March 2029" in page.data[0].content[0].text
    plain.vector_stores.files.delete(file_id=contract.id, vector_store_id=store.id)
    after = plain.vector_stores.search(store.id, query="When does the supplier contract end?")
    assert [r.file_id for r in after.data] == [uploaded.id]  # the deleted file is gone at once
    for path in [*Path(stack.home).rglob("*"), *Path(stack.tmpdir).rglob("*")]:
        if path.is_file() and path.stat().st_size < 64 << 20:
            data = path.read_bytes()
            assert b"Quokka Freight" not in data and b"paid holiday" not in data, path


def test_sealed_files_and_vector_stores_on_sealed_up(embedding_stack: RunningStack) -> None:
    """The official SDK's files.create, vector_stores.create, files.upload_and_poll and search through
    SealedOpenAI: the upload and the search are sealed to the attested encoder's worker, the receipt
    names the file the passage came from, and a canary in the document and the query is in no file
    of the stack (its database, logs, audit)."""
    stack = embedding_stack
    sealed = SealedOpenAI(base_url=f"{stack.url}/v1", api_key=stack.api_key, max_retries=0,
                          policy=demo_client_policy(stack.home), retrieval_model=EMBEDDING_MODEL)
    canary = "Wombat-Lantern-7f3c21"
    vault = f"The vault under the Wombat Lantern opens with the code {canary} on Tuesdays only."
    uploaded = sealed.files.create(file=("vault.txt", vault.encode()), purpose="assistants")
    assert (uploaded.filename, uploaded.bytes, uploaded.purpose) == ("vault.txt", len(vault), "assistants")
    assert sealed.sealed.receipts[-1].model == EMBEDDING_MODEL
    store = sealed.vector_stores.create(name="sealed-handbook")
    attached = sealed.vector_stores.files.create_and_poll(vector_store_id=store.id, file_id=uploaded.id)
    contract = sealed.vector_stores.files.upload_and_poll(vector_store_id=store.id,
                                                           file=("contract.txt", CONTRACT.encode()))
    assert attached.status == "completed" and contract.status == "completed"
    page = sealed.vector_stores.search(store.id, query=f"Which code opens the vault? {canary}", max_num_results=1)
    assert [r.file_id for r in page.data] == [uploaded.id] and canary in page.data[0].content[0].text
    assert sealed.sealed.receipts[-1].file_ids == (uploaded.id,)  # the receipt covers the retrieved files
    logs = [Path(stack.home).parent / "up.log"]
    for path in [*Path(stack.home).rglob("*"), *Path(stack.tmpdir).rglob("*"), *logs]:
        if path.is_file() and path.stat().st_size < 64 << 20:
            assert canary.encode() not in path.read_bytes(), path


def test_file_search_on_sealed_up(embedding_stack: RunningStack) -> None:
    """`responses.create` with the file_search tool: the gateway searches the encoder's worker, the
    chat model answers from the passages, and the answer cites the file they came from. Through
    SealedOpenAI without a `retrieval_model` the tool is refused before anything is sent."""
    stack = embedding_stack
    plain = openai.OpenAI(base_url=f"{stack.url}/v1", api_key=stack.api_key, max_retries=0)
    store = plain.vector_stores.create(name="grounding")
    contract = plain.vector_stores.files.upload_and_poll(vector_store_id=store.id,
                                                          file=("contract.txt", CONTRACT.encode()))
    holidays = plain.vector_stores.files.upload_and_poll(vector_store_id=store.id,
                                                          file=("holidays.txt", HOLIDAYS.encode()))
    assert contract.status == "completed" and holidays.status == "completed"
    tools: Any = [{"type": "file_search", "vector_store_ids": [store.id], "max_num_results": 1}]
    answer = plain.responses.create(model=DEMO_MODEL, input="When does the supplier contract end?", tools=tools,
                                    max_output_tokens=16, include=["file_search_call.results"])
    call, message = answer.output
    assert call.type == "file_search_call" and call.queries == ["When does the supplier contract end?"]
    assert call.results is not None and [r.file_id for r in call.results] == [contract.id]
    assert message.type == "message" and message.content[0].type == "output_text"
    assert [(a.type, a.file_id, a.filename) for a in message.content[0].annotations] == [  # type: ignore[union-attr]
        ("file_citation", contract.id, "contract.txt")]
    sealed = SealedOpenAI(base_url=f"{stack.url}/v1", api_key=stack.api_key, max_retries=0,
                          policy=demo_client_policy(stack.home))
    with pytest.raises(UnsealedRequest, match="retrieval_model"):
        sealed.responses.create(model=DEMO_MODEL, input="When does the supplier contract end?", tools=tools)


class _Tampering(httpx2.HTTPTransport):
    """The operator's relay: flips one byte of the sealed search answer's end (its receipt record),
    and keeps the path of every request it relays."""

    def __init__(self) -> None:
        super().__init__()
        self.paths: list[str] = []

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        self.paths.append(request.url.path)
        response = super().handle_request(request)
        if not request.url.path.endswith("/search") or response.status_code != 200:
            return response
        raw = bytearray(response.read())
        raw[-5] ^= 0x01
        return httpx2.Response(200, headers=response.headers, content=bytes(raw), request=request)


def test_sealed_file_search_on_sealed_up(embedding_stack: RunningStack) -> None:
    """`responses.create(tools=[file_search])` through SealedOpenAI: a sealed search on the encoder's
    worker (its receipt names the file), then a sealed response on the chat model's worker with the
    passage; the answer cites the file; the document's and the query's canaries are in no file or
    log of the stack. A relay that tampers with the search's sealed answer gets the search refused
    by the client, and no prompt is sent."""
    stack = embedding_stack
    kwargs: Any = {"base_url": f"{stack.url}/v1", "api_key": stack.api_key, "max_retries": 0,
                   "policy": demo_client_policy(stack.home), "retrieval_model": EMBEDDING_MODEL}
    sealed = SealedOpenAI(**kwargs)
    canary = "Numbat-Quill-5e81d0"
    harbour = f"The harbour gate code is {canary}; the gate closes at nine in the evening."
    store = sealed.vector_stores.create(name="sealed-grounding")
    gate = sealed.vector_stores.files.upload_and_poll(vector_store_id=store.id, file=("gate.txt", harbour.encode()))
    other = sealed.vector_stores.files.upload_and_poll(vector_store_id=store.id, file=("holidays.txt",
                                                                                        HOLIDAYS.encode()))
    assert gate.status == other.status == "completed"
    question = f"What is the harbour gate code? Numbat-Query-{canary[-6:]}"
    tools: Any = [{"type": "file_search", "vector_store_ids": [store.id], "max_num_results": 1}]
    answer = sealed.responses.create(model=DEMO_MODEL, input=question, tools=tools, max_output_tokens=16,
                                     include=["file_search_call.results"])
    call, message = answer.output
    assert call.type == "file_search_call" and call.queries == [question]
    assert call.results is not None and [r.file_id for r in call.results] == [gate.id]
    assert canary in (call.results[0].text or "")
    assert message.type == "message" and message.content[0].type == "output_text"
    assert [(a.type, a.file_id, a.filename) for a in message.content[0].annotations] == [  # type: ignore[union-attr]
        ("file_citation", gate.id, "gate.txt")]
    search_receipt, answer_receipt = list(sealed.sealed.receipts)[-2:]
    assert (search_receipt.model, search_receipt.file_ids) == (EMBEDDING_MODEL, (gate.id,))
    assert (answer_receipt.model, answer_receipt.file_ids) == (DEMO_MODEL, ())
    logs = [Path(stack.home).parent / "up.log"]
    for path in [*Path(stack.home).rglob("*"), *Path(stack.tmpdir).rglob("*"), *logs]:
        if path.is_file() and path.stat().st_size < 64 << 20:
            data = path.read_bytes()
            assert canary.encode() not in data and b"Numbat-Query" not in data, path

    relay = _Tampering()
    tampered = SealedOpenAI(**kwargs, inner_transport=relay)
    with pytest.raises((ResponseCorrupted, ReceiptInvalid)):
        tampered.responses.create(model=DEMO_MODEL, input=question, tools=tools, max_output_tokens=16)
    assert any(p.endswith(f"/v1/sealed/vector_stores/{store.id}/search") for p in relay.paths)
    assert not [p for p in relay.paths if p.endswith("/responses")]  # no prompt left the client


def test_bench_retrieval_through_sealed_up(embedding_stack: RunningStack) -> None:
    """`sealed bench retrieval --stack-url` (smoke, a few dozen chunks): the same corpus ingested and
    searched by the library in plain Python and through this stack's API, interleaved; both sides
    find the exact search's passages, and the bench removes its store and files afterwards."""
    from sealed_bench.bench_retrieval import main

    stack = embedding_stack
    plain = openai.OpenAI(base_url=f"{stack.url}/v1", api_key=stack.api_key, max_retries=0)
    stores_before = {s.id for s in plain.vector_stores.list()}
    out = Path(stack.tmpdir) / "bench-retrieval.json"
    assert main(["--chunks", "40", "--queries", "8", "--file-chunks", "10", "--threads", "1",
                 "--stack-url", stack.url, "--api-key", stack.api_key, "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["corpus"]["chunks"] >= 40 and report["corpus"]["files"] >= 2
    assert report["search"]["stack"]["n"] == report["search"]["stack_sdk"]["n"] == report["search"]["plain"]["n"] == 8
    assert report["ingestion"]["stack"]["chunks_per_s"] > 0 and report["ingestion"]["stack"]["store_usage_bytes"] > 0
    # A passage's opening is the query: its own chunk is among the exact top 10, so a recall of 0
    # would mean the stack's passages do not match the plain side's chunks.
    assert min(report["recall_at_10"][side] for side in ("stack", "stack_sdk", "plain")) > 0.5
    assert set(report["stack_over_plain"]) == {"ingestion_seconds", "search_p50", "search_p99",
                                               "search_p50_openai_sdk", "search_p99_openai_sdk"}
    assert {s.id for s in plain.vector_stores.list()} == stores_before
