"""Retrieval in sealed mode through the real gateway and a real worker (real gRPC, the real encoder):
a sealed upload and a sealed search (docs/retrieval.md "Sealed mode"), sealed as SealedOpenAI seals
them. The gateway relays ciphertext: a canary in the document and the query is in no log line, no
file or row of the gateway's; the receipt names the files the passages came from; the tenant's sealed
decision record gets one `retrieval` decision per file, the gateway's audit none. Refused: a request
sealed to another worker key, a search whose snapshot is another store's than the sealed id, and a
caller's search over a file its signed `file_access` does not let it read gives no passage of it."""

from __future__ import annotations

import base64
import json
import logging
import time
from pathlib import Path
from typing import Any

import pytest

from api.gateway.retrieval_audit import file_ids_of
from enclave_worker.engine.embedder import Embedder
from protocol.rpc import worker_pb2
from protocol.sealed import Receipt, RequestContext, api_key_id, seal_request
from protocol.sealed.caller import CallerCredential
from protocol.sealed.http import (
    FILES_ENDPOINT,
    HEADER_KEY_ID,
    HEADER_MODEL,
    REQUEST_CONTENT_TYPE,
    SEARCH_ENDPOINT,
    ResponseHead,
)
from protocol.sealed.receipt import read_signed_receipt
from tests.api.retrieval_stack import (
    RetrievalStack,
    encoder_fixture,  # noqa: F401 (the fixture "encoder")
    retrieval_stack,
    stack_fixture,  # noqa: F401 (the fixture "stack")
)
from tests.security.caller_harness import MODEL, TENANT

CANARY = "CANARY-sealed-vs-51e2b8"
QUESTION = f"When does the supplier contract end? {CANARY}-query"
CONTRACT = f"The supplier contract ends on 31 March. Termination needs 90 days notice. {CANARY}"
HOLIDAYS = "Employees get 28 days of paid holiday a year, plus public holidays."


Answer = tuple[int, dict[str, Any], Receipt | None]


async def sealed_call(stack: RetrievalStack, path: str, endpoint: str, body: dict[str, Any], *,
                      api_key: str | None = None, worker_key_id: str | None = None) -> Answer:
    """(inner status, inner JSON, verified receipt) of one sealed call, or (gateway status, its JSON, None)."""
    api_key = api_key or stack.tenant_key
    key, guard = stack.state.serving_key, stack.state.guard
    ctx = RequestContext(TENANT, MODEL, endpoint, key.key_id, version="v1", api_key_id=api_key_id(api_key),
                         policy_version=guard.policy_set.version if guard and guard.policy_set else 0)
    sealed = seal_request(key.public_bytes, ctx, json.dumps({"model": MODEL, **body}).encode(), time.time(),
                          caller=CallerCredential(api_key=api_key).encode())
    answer = await stack.http.post(path, content=sealed.wire, headers={
        "Authorization": f"Bearer {api_key}", "Content-Type": REQUEST_CONTENT_TYPE, HEADER_MODEL: MODEL,
        HEADER_KEY_ID: worker_key_id or key.key_id})
    if answer.headers.get("content-type", "").startswith("application/json"):
        return answer.status_code, answer.json(), None
    parts = sealed.opener.feed(answer.content)
    sealed.opener.close()
    head = ResponseHead.decode(parts[0][0])
    assert parts[-1][1], "the last part is the receipt"
    return head.status, json.loads(b"".join(p for p, _ in parts[1:-1])), read_signed_receipt(parts[-1][0])


async def upload(stack: RetrievalStack, name: str, text: str, api_key: str | None = None) -> Answer:
    return await sealed_call(stack, "/v1/sealed/files", FILES_ENDPOINT, {
        "filename": name, "purpose": "assistants", "content": base64.b64encode(text.encode()).decode()},
        api_key=api_key)


async def search(stack: RetrievalStack, store_id: str, query: str = QUESTION, *, url_store: str | None = None,
                 api_key: str | None = None, **extra: Any) -> Answer:
    return await sealed_call(stack, f"/v1/vector_stores/{url_store or store_id}/search".replace("/v1/", "/v1/sealed/"),
                             SEARCH_ENDPOINT, {"vector_store_id": store_id, "query": query, **extra}, api_key=api_key)


async def attach(stack: RetrievalStack, store_id: str, file_id: str, attributes: dict[str, Any] | None = None) -> None:
    """In clear: ids and attributes (the gateway's rows hold them anyway)."""
    done = await stack.sdk().vector_stores.files.create(store_id, file_id=file_id, attributes=attributes)
    assert done.status == "completed", done


async def test_sealed_upload_and_search_keep_the_text_from_the_gateway(
        stack: RetrievalStack, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    caplog.set_level(logging.DEBUG)
    recorded: list[worker_pb2.UsageRecord] = []
    seal_record = stack.state.records.seal

    def keep(request: Any, decisions: Any, at: float) -> Any:
        recorded.extend(decisions)
        return seal_record(request, decisions, at)

    monkeypatch.setattr(stack.state.records, "seal", keep)
    status, contract, receipt = await upload(stack, "contract.txt", CONTRACT)
    assert status == 200 and contract["object"] == "file" and contract["bytes"] == len(CONTRACT), contract
    assert receipt is not None and receipt.file_ids == ()
    status, holidays, _ = await upload(stack, "holidays.txt", HOLIDAYS)
    assert status == 200
    listed = await stack.sdk().files.retrieve(contract["id"])  # the gateway's row: id, name, size in clear
    assert listed.bytes == len(CONTRACT) and listed.filename == "contract.txt"
    store = await stack.sdk().vector_stores.create(name="sealed")
    await attach(stack, store.id, contract["id"])
    await attach(stack, store.id, holidays["id"])

    status, page, receipt = await search(stack, store.id, max_num_results=1)
    assert status == 200 and [r["file_id"] for r in page["data"]] == [contract["id"]]
    assert CANARY in page["data"][0]["content"][0]["text"]
    assert receipt is not None and receipt.file_ids == (contract["id"],)  # the receipt covers what was retrieved
    retrieves = [json.loads(r.payload) for r in recorded]
    assert [(d["action"], d["rule"], d["policy_id"]) for d in retrieves] == [
        ("retrieval", contract["id"], store.id)]

    # The gateway saw ciphertext and ids only: its files and database, its logs, its audit.
    for path in stack.data_dir.rglob("*"):
        if path.is_file():
            assert CANARY.encode() not in path.read_bytes(), path
    assert CANARY not in caplog.text and "supplier contract" not in caplog.text
    audit = stack.service.audit
    audit.flush()
    entries = [json.loads(line) for line in audit.path.read_text().splitlines()]
    assert [e["metadata"].get("sealed") for e in entries if e["action"] == "vector_store.search"] == [True]
    # Which files: the tenant's sealed record has them, the gateway's entry none.
    assert not [e for e in entries if e["action"] == "vector_store.search" and file_ids_of(e["metadata"])]


async def test_sealed_requests_the_gateway_misroutes_are_refused(stack: RetrievalStack) -> None:
    status, contract, _ = await upload(stack, "contract.txt", CONTRACT)
    assert status == 200
    store = await stack.sdk().vector_stores.create(name="a")
    other = await stack.sdk().vector_stores.create(name="b")
    await attach(stack, store.id, contract["id"])
    # Sealed to a key this worker does not hold: the client must verify again; nothing is answered.
    status, error, receipt = await sealed_call(stack, f"/v1/sealed/vector_stores/{store.id}/search", SEARCH_ENDPOINT,
                                               {"vector_store_id": store.id, "query": QUESTION},
                                               worker_key_id="ab" * 32)
    assert status == 409 and receipt is None and error["error"]["code"] == "reattest_required", error
    status, error, receipt = await sealed_call(stack, "/v1/sealed/files", FILES_ENDPOINT, {
        "filename": "x.txt", "purpose": "assistants", "content": base64.b64encode(CONTRACT.encode()).decode()},
        worker_key_id="ab" * 32)
    assert status == 409 and receipt is None and error["error"]["code"] == "reattest_required", error
    # The query sealed for one store, the snapshot of another sent with it: the worker refuses.
    status, error, receipt = await search(stack, store.id, url_store=other.id)
    assert status == 400 and error["error"]["param"] == "vector_store_id" and receipt is not None
    # Unknown store and a bad body: refused, nothing searched.
    status, _, _ = await search(stack, "vs-nope")
    assert status == 404
    status, error, _ = await search(stack, store.id, query="")
    assert status == 400 and "query" in error["error"]["message"]
    status, error, _ = await sealed_call(stack, "/v1/sealed/files", FILES_ENDPOINT, {
        "filename": "x.txt", "purpose": "fine-tune", "content": base64.b64encode(b"x").decode()})
    assert status == 400 and error["error"]["param"] == "purpose"
    assert [f.id for f in (await stack.sdk().files.list()).data] == [contract["id"]]  # the refused upload kept nothing


async def test_a_caller_without_rights_gets_no_passages_in_sealed_mode(tmp_path: Path, encoder: Embedder) -> None:
    def legal_only_for_the_tenant_key(tenant: str, reader: str) -> dict[str, Any]:
        return {"default": "allow", "rules": [{"attribute": "team", "value": "legal", "api_keys": [tenant]}]}

    async with retrieval_stack(tmp_path, encoder, file_access=legal_only_for_the_tenant_key) as stack:
        _, legal, _ = await upload(stack, "contract.txt", CONTRACT)
        _, hr, _ = await upload(stack, "holidays.txt", HOLIDAYS)
        store = await stack.sdk().vector_stores.create(name="s")
        await attach(stack, store.id, legal["id"], {"team": "legal"})
        await attach(stack, store.id, hr["id"], {"team": "hr"})
        _, page, _ = await search(stack, store.id, max_num_results=1)
        assert [r["file_id"] for r in page["data"]] == [legal["id"]]
        for extra in ({}, {"filters": {"type": "eq", "key": "team", "value": "legal"}}, {"max_num_results": 50}):
            status, page, receipt = await search(stack, store.id, api_key=stack.reader_key, **extra)
            assert status == 200 and legal["id"] not in [r["file_id"] for r in page["data"]]
            assert all(CANARY not in r["content"][0]["text"] for r in page["data"])
            assert receipt is not None and legal["id"] not in receipt.file_ids
