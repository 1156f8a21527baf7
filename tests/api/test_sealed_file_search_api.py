"""The file_search tool in sealed mode (sealed_client/file_search.py) through the real gateway and a
real worker (real gRPC, the real encoder, a stand-in chat model that records its prompts): the
client's two sealed exchanges, each sealed to the worker's key and opened and checked here as
SealedOpenAI opens them. The passages reach the chat model before the input and the answer cites
their files; the gateway sees ciphertext and store ids only (a canary in the document and the query
is in no file, row, log line or audit entry of the gateway's); a caller whose signed `file_access`
does not let it read a file gets no passage of it, in the prompt or as a citation."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx2
import pytest

from api.gateway.retrieval_audit import file_ids_of
from enclave_worker.engine.embedder import Embedder
from protocol.sealed import Receipt, RequestContext, api_key_id, seal_request
from protocol.sealed.caller import CallerCredential
from protocol.sealed.http import HEADER_KEY_ID, HEADER_MODEL, REQUEST_CONTENT_TYPE, ResponseHead
from protocol.sealed.receipt import read_signed_receipt
from sealed_client import steps
from sealed_client.file_search import file_search, serve
from sealed_client.retrieval import check_retrieved, retrieval_route, sealed_call
from tests.api.retrieval_stack import (
    RetrievalStack,
    encoder_fixture,  # noqa: F401 (the fixture "encoder")
    retrieval_stack,
)
from tests.api.test_file_search_api import RecordingEngine
from tests.security.caller_harness import MODEL, TENANT

CANARY = "CANARY-sealed-fs-7d41a9"
CONTRACT = f"The supplier contract ends on 31 March. Termination needs 90 days notice. {CANARY}"
HOLIDAYS = "Employees get 28 days of paid holiday a year, plus public holidays."
QUESTION = f"When does the supplier contract end? {CANARY}-query"


def sealing(
    stack: RetrievalStack, api_key: str, receipts: list[Receipt], sent: list[str]
) -> Callable[[httpx2.Request], Awaitable[httpx2.Response]]:
    """What SealedTransport does with each request the plan sends: seal it to the worker's key, post
    it to the sealed route, open the answer and check its receipt (a search's: its file ids)."""
    key, guard = stack.state.serving_key, stack.state.guard

    async def send(request: httpx2.Request) -> httpx2.Response:
        body = request.read()
        endpoint = retrieval_route(request) or "/v1/responses"
        if endpoint == "/v1/responses":
            path = "/v1/sealed/responses"
        else:
            call = sealed_call(request, body, endpoint, MODEL)
            body, path = call.body, call.path
        sent.append(path)
        ctx = RequestContext(
            TENANT,
            MODEL,
            endpoint,
            key.key_id,
            version="v1",
            api_key_id=api_key_id(api_key),
            policy_version=guard.policy_set.version if guard and guard.policy_set else 0,
        )
        sealed = seal_request(
            key.public_bytes, ctx, body, time.time(), caller=CallerCredential(api_key=api_key).encode()
        )
        answer = await stack.http.post(
            path,
            content=sealed.wire,
            headers={
                "Authorization": f"Bearer {api_key}",
                "Content-Type": REQUEST_CONTENT_TYPE,
                HEADER_MODEL: MODEL,
                HEADER_KEY_ID: key.key_id,
            },
        )
        if answer.headers["content-type"].startswith("application/json"):  # the gateway's refusal
            assert answer.status_code >= 400, answer.text
            return httpx2.Response(answer.status_code, content=answer.content, headers=dict(answer.headers))
        parts = sealed.opener.feed(answer.content)
        sealed.opener.close()
        head = ResponseHead.decode(parts[0][0])
        inner = b"".join(p for p, _ in parts[1:-1])
        receipt = read_signed_receipt(parts[-1][0])
        if endpoint != "/v1/responses":
            check_retrieved(receipt, head.status, inner)
        receipts.append(receipt)
        return httpx2.Response(head.status, content=inner, headers={"content-type": head.content_type})

    return send


async def upload(stack: RetrievalStack, name: str, text: str, team: str, store_id: str) -> str:
    form = httpx2.Request(
        "POST", "http://gw/v1/files", files={"file": (name, text.encode())}, data={"purpose": "assistants"}
    )
    send = sealing(stack, stack.tenant_key, [], [])
    uploaded = await send(form)
    assert uploaded.status_code == 200, uploaded.text
    file_id: str = uploaded.json()["id"]
    done = await stack.sdk().vector_stores.files.create(store_id, file_id=file_id, attributes={"team": team})
    assert done.status == "completed", done
    return file_id


async def responses(
    stack: RetrievalStack, doc: dict[str, Any], api_key: str | None = None
) -> tuple[httpx2.Response, list[Receipt], list[str]]:
    """A Responses request as the SDK sends it, served as SealedOpenAI serves one with file_search."""
    api_key = api_key or stack.tenant_key
    request = httpx2.Request(
        "POST", "http://gw/v1/responses", json={"model": MODEL, **doc}, headers={"Authorization": f"Bearer {api_key}"}
    )
    plan = file_search(request, request.read(), "/v1/responses")
    assert plan is not None and not isinstance(plan, httpx2.Response)
    receipts: list[Receipt] = []
    sent: list[str] = []
    answer = await steps.drive_async(serve(request, plan, steps.send), sealing(stack, api_key, receipts, sent))
    return answer, receipts, sent


def tool(store_id: str, **extra: Any) -> dict[str, Any]:
    return {"type": "file_search", "vector_store_ids": [store_id], **extra}


async def test_a_sealed_grounded_answer_cites_its_file_and_the_gateway_sees_ids_only(
    tmp_path: Path, encoder: Embedder, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    chat = RecordingEngine()
    async with retrieval_stack(tmp_path, encoder, chat_engine=chat) as stack:
        store = await stack.sdk().vector_stores.create(name="sealed")
        contract = await upload(stack, "contract.txt", CONTRACT, "legal", store.id)
        await upload(stack, "holidays.txt", HOLIDAYS, "hr", store.id)
        answer, receipts, sent = await responses(
            stack,
            {
                "input": QUESTION,
                "instructions": "Be brief.",
                "tools": [tool(store.id, max_num_results=1)],
                "include": ["file_search_call.results"],
            },
        )
        assert answer.status_code == 200, answer.text
        doc = answer.json()
        call, message = doc["output"]
        assert call["type"] == "file_search_call" and call["queries"] == [QUESTION]
        assert [r["file_id"] for r in call["results"]] == [contract] and CANARY in call["results"][0]["text"]
        assert message["content"][0]["annotations"] == [
            {
                "type": "file_citation",
                "index": len(message["content"][0]["text"]),
                "file_id": contract,
                "filename": "contract.txt",
            }
        ]
        assert doc["tools"] == [tool(store.id, max_num_results=1)]
        # Two sealed exchanges: the search (its receipt names the file) then the response.
        assert sent == [f"/v1/sealed/vector_stores/{store.id}/search", "/v1/sealed/responses"]
        assert receipts[0].file_ids == (contract,) and receipts[1].file_ids == ()
        prompt = chat.prompts[-1]
        assert prompt.index("Be brief.") < prompt.index(f"[contract.txt]\n{CONTRACT}") < prompt.index(QUESTION)
        assert HOLIDAYS not in prompt
        # The gateway relayed ciphertext: no query, passage or answer in its files, logs or audit.
        for path in stack.data_dir.rglob("*"):
            if path.is_file():
                assert CANARY.encode() not in path.read_bytes(), path
        assert CANARY not in caplog.text and "supplier contract" not in caplog.text
        stack.service.audit.flush()
        entries = [json.loads(line) for line in stack.service.audit.path.read_text().splitlines()]
        assert CANARY not in json.dumps(entries)
        assert not [e for e in entries if file_ids_of(e["metadata"])]  # which files: sealed record


async def test_a_caller_without_rights_gets_no_passage_or_citation_in_sealed_mode(
    tmp_path: Path, encoder: Embedder
) -> None:
    def legal_only_for_the_tenant_key(tenant: str, reader: str) -> dict[str, Any]:
        return {"default": "allow", "rules": [{"attribute": "team", "value": "legal", "api_keys": [tenant]}]}

    chat = RecordingEngine()
    async with retrieval_stack(tmp_path, encoder, file_access=legal_only_for_the_tenant_key, chat_engine=chat) as stack:
        store = await stack.sdk().vector_stores.create(name="sealed")
        legal = await upload(stack, "contract.txt", CONTRACT, "legal", store.id)
        await upload(stack, "holidays.txt", HOLIDAYS, "hr", store.id)
        for extra in ({}, {"max_num_results": 50}, {"filters": {"type": "eq", "key": "team", "value": "legal"}}):
            answer, receipts, _ = await responses(
                stack,
                {"input": QUESTION, "tools": [tool(store.id, **extra)], "include": ["file_search_call.results"]},
                api_key=stack.reader_key,
            )
            assert answer.status_code == 200, answer.text
            call, message = answer.json()["output"]
            assert legal not in [r["file_id"] for r in call["results"]]
            cited = [a["file_id"] for a in message["content"][0]["annotations"]]
            assert legal not in cited and legal not in receipts[0].file_ids
            assert "90 days notice" not in chat.prompts[-1] and "contract.txt" not in chat.prompts[-1]
        assert cited == [] and "no passages" in chat.prompts[-1]  # the legal filter: nothing it may read
        mine, receipts, _ = await responses(stack, {"input": QUESTION, "tools": [tool(store.id)]})
        assert legal in [a["file_id"] for a in mine.json()["output"][1]["content"][0]["annotations"]]
        assert legal in receipts[0].file_ids and CONTRACT in chat.prompts[-1]  # the rule, not the query, kept it out


async def test_a_refused_search_sends_no_prompt(tmp_path: Path, encoder: Embedder) -> None:
    chat = RecordingEngine()
    async with retrieval_stack(tmp_path, encoder, chat_engine=chat) as stack:
        answer, _, sent = await responses(stack, {"input": QUESTION, "tools": [tool("vs-unknown")]})
        assert answer.status_code == 404 and sent == ["/v1/sealed/vector_stores/vs-unknown/search"]
        assert chat.prompts == []


def _events(body: bytes) -> list[dict[str, Any]]:
    data = [line[len("data: "):] for raw in body.decode().split("\n\n") for line in raw.splitlines()
            if line.startswith("data: ") and line != "data: [DONE]"]
    return [json.loads(d) for d in data]


async def test_a_streamed_sealed_answer_is_the_plaintext_paths_event_sequence(
    tmp_path: Path, encoder: Embedder
) -> None:
    chat = RecordingEngine()
    async with retrieval_stack(tmp_path, encoder, chat_engine=chat) as stack:
        store = await stack.sdk().vector_stores.create(name="sealed")
        contract = await upload(stack, "contract.txt", CONTRACT, "legal", store.id)
        await upload(stack, "holidays.txt", HOLIDAYS, "hr", store.id)
        plain = [e.model_dump() async for e in await stack.sdk().responses.create(
            model=MODEL, input=QUESTION, stream=True, tools=[tool(store.id, max_num_results=1)])]  # type: ignore[list-item]
        answer, receipts, sent = await responses(
            stack, {"input": QUESTION, "stream": True, "tools": [tool(store.id, max_num_results=1)]})
        assert answer.status_code == 200 and answer.headers["content-type"].startswith("text/event-stream")
        sealed = _events(await answer.aread())
        # The same events in the same order, at the same output indexes: the search's item first, each
        # citation before output_text.done.
        assert [(e["type"], e.get("output_index")) for e in sealed] == [
            (e["type"], e.get("output_index")) for e in plain]
        kinds = [e["type"] for e in sealed]
        assert kinds.index("response.file_search_call.completed") < kinds.index("response.output_text.delta")
        assert kinds.index("response.output_text.annotation.added") < kinds.index("response.output_text.done")
        final = sealed[-1]["response"]
        call, message = final["output"]
        assert call["type"] == "file_search_call" and call["results"] is None
        assert [a["file_id"] for a in message["content"][0]["annotations"]] == [contract]
        assert final["tools"] == [tool(store.id, max_num_results=1)]
        # Two sealed exchanges, both receipts kept (the search's first, naming the file).
        assert sent == [f"/v1/sealed/vector_stores/{store.id}/search", "/v1/sealed/responses"]
        assert receipts[0].file_ids == (contract,) and len(receipts) == 2
        assert CONTRACT in chat.prompts[-1]
