"""A streamed sealed file_search (sealed_client/file_search_stream.py): the worker's Responses events
for the grounded request become the plaintext path's events for the same request (the same types in
the same order, the same output indexes, the citations before output_text.done and in the final
response), read by the sync and the async driver and by the openai SDK; a search that does not
verify sends no prompt; a stream that raises while it opens (cut, tampered) raises through it."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx2
import openai
import pytest

from protocol.openai.file_search import Grounding
from protocol.openai.responses import responses_events
from protocol.openai.responses_request import ResponsesRequest
from protocol.sealed import ReceiptInvalid, ResponseCorrupted
from sealed_client.file_search import FileSearchPlan, file_search, serve
from sealed_client.steps import drive, drive_async, send
from tests.sealed_client.test_sealed_file_search_client import PAGES, TOOLS, _request

TEXT = ["It ", "ends ", "in March."]
CHAT = [{"choices": [{"index": 0, "delta": {"content": t}, "finish_reason": None}]} for t in TEXT] + [
    {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
    {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}},
]


async def _chat() -> AsyncIterator[bytes]:
    for chunk in CHAT:
        yield f"data: {json.dumps(chunk)}\n\n".encode()
    yield b"data: [DONE]\n\n"


def _events(doc: dict[str, Any], grounding: Grounding | None) -> bytes:
    """What protocol/openai/responses.py streams for `doc`: the gateway's, with a grounding (plaintext
    mode), or the chat worker's for the grounded request, without."""

    async def collect() -> bytes:
        req = ResponsesRequest.model_validate(doc)
        return b"".join([e async for e in responses_events(req, _chat(), {"created": 1}, grounding=grounding)])

    with concurrent.futures.ThreadPoolExecutor(1) as pool:  # its own loop: a caller may be in one
        return pool.submit(asyncio.run, collect()).result()


def _parsed(body: bytes) -> list[dict[str, Any]]:
    out = []
    for raw in body.decode().split("\n\n"):
        data = [line[len("data: "):] for line in raw.splitlines() if line.startswith("data: ")]
        if data and data[0] != "[DONE]":
            out.append(json.loads(data[0]))
    return out


class Gateway:
    """Answers each search with its page and the response with the worker's event stream (as opened)."""

    def __init__(self, search_status: int = 200, stream: type[httpx2.SyncByteStream] | None = None) -> None:
        self.sent: list[tuple[str, dict[str, Any]]] = []
        self.search_status, self.stream = search_status, stream

    def __call__(self, request: httpx2.Request) -> httpx2.Response:
        body = json.loads(request.read())
        self.sent.append((request.url.path, body))
        if request.url.path.endswith("/search"):
            store = request.url.path.split("/")[-2]
            return httpx2.Response(self.search_status, json={"data": PAGES[store]})
        events = _events(body, None) + b"data: [DONE]\n\n"
        headers = {"content-type": "text/event-stream"}
        if self.stream is not None:
            return httpx2.Response(200, headers=headers, stream=self.stream())
        return httpx2.Response(200, headers=headers, content=events)

    async def async_call(self, request: httpx2.Request) -> httpx2.Response:
        return self(request)


DOC: dict[str, Any] = {"input": "When?", "stream": True, "tools": TOOLS, "include": ["file_search_call.results"]}


def _plaintext() -> list[dict[str, Any]]:
    """The gateway's stream for DOC over the same passages (plaintext mode)."""
    request = _request(DOC)
    plan = file_search(request, request.read(), "/v1/responses")
    assert isinstance(plan, FileSearchPlan)
    grounding = plan.grounding([{"data": PAGES["vs-a"]}, {"data": PAGES["vs-b"]}])
    return _parsed(_events({"model": "chat", **DOC}, grounding))


def _shape(events: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return [(e["type"], e["sequence_number"], e.get("output_index"), json.dumps(e.get("annotation"))) for e in events]


def test_the_sealed_stream_is_the_plaintext_paths_event_sequence() -> None:
    gateway = Gateway()
    request = _request(DOC)
    plan = file_search(request, request.read(), "/v1/responses")
    assert isinstance(plan, FileSearchPlan)
    answer = drive(serve(request, plan, send), gateway)
    sealed = _parsed(b"".join(answer.iter_bytes()))
    plain = _plaintext()
    assert _shape(sealed) == _shape(plain)
    kinds = [e["type"] for e in sealed]
    assert kinds[2:7] == ["response.output_item.added", "response.file_search_call.in_progress",
                          "response.file_search_call.searching", "response.file_search_call.completed",
                          "response.output_item.done"]
    assert kinds.index("response.output_text.annotation.added") < kinds.index("response.output_text.done")
    # The final response: the item first (with results: the include), the citations, the caller's tools.
    final, expected = sealed[-1]["response"], plain[-1]["response"]
    assert [o["type"] for o in final["output"]] == ["file_search_call", "message"]
    assert final["output"][0]["results"] == expected["output"][0]["results"]
    assert final["output"][1]["content"] == expected["output"][1]["content"]
    assert final["tools"] == TOOLS and final["include"] == ["file_search_call.results"]
    assert all(e["response"]["tools"] == TOOLS for e in sealed if "response" in e)
    # The worker was asked for a stream without the tool; the searches came first.
    paths = [p for p, _ in gateway.sent]
    assert paths[-1] == "/v1/responses" and gateway.sent[-1][1]["stream"] is True
    assert "tools" in gateway.sent[-1][1] and all(t["type"] != "file_search" for t in gateway.sent[-1][1]["tools"])


def test_the_async_driver_gives_the_same_stream() -> None:
    gateway = Gateway()
    request = _request(DOC)
    plan = file_search(request, request.read(), "/v1/responses")
    assert isinstance(plan, FileSearchPlan)

    async def run() -> bytes:
        answer = await drive_async(serve(request, plan, send), gateway.async_call)
        return b"".join([part async for part in answer.aiter_bytes()])

    assert _shape(_parsed(asyncio.run(run()))) == _shape(_plaintext())


def test_the_sdk_reads_the_sealed_stream() -> None:
    gateway = Gateway()

    def handle(request: httpx2.Request) -> httpx2.Response:
        plan = file_search(request, request.read(), "/v1/responses")
        assert isinstance(plan, FileSearchPlan)
        return drive(serve(request, plan, send), gateway)

    sdk = openai.OpenAI(base_url="http://gw/v1", api_key="k", max_retries=0,
                        http_client=httpx2.Client(transport=httpx2.MockTransport(handle)))
    events = list(sdk.responses.create(model="chat", input="When?", stream=True, tools=TOOLS))  # type: ignore[arg-type]
    kinds = [e.type for e in events]
    assert kinds.count("response.output_text.annotation.added") == 2 and kinds[-1] == "response.completed"
    final = events[-1].response  # type: ignore[union-attr]
    assert final.output[0].type == "file_search_call" and final.output[0].results is None  # type: ignore[union-attr]
    cited = [a.file_id for a in final.output[1].content[0].annotations]  # type: ignore[union-attr]
    assert cited == ["file-3", "file-1"]


def test_an_unverified_or_refused_search_sends_no_prompt() -> None:
    gateway = Gateway(search_status=404)
    answer = drive(serve(_request({}), _plan_of(DOC), send), gateway)
    assert answer.status_code == 404 and [p for p, _ in gateway.sent] == ["/v1/vector_stores/vs-a/search"]

    def unverified(request: httpx2.Request) -> httpx2.Response:
        gateway.sent.append((request.url.path, {}))
        raise ReceiptInvalid("the receipt's file ids are not the files")

    gateway.sent.clear()
    with pytest.raises(ReceiptInvalid):
        drive(serve(_request({}), _plan_of(DOC), send), unverified)
    assert [p for p, _ in gateway.sent] == ["/v1/vector_stores/vs-a/search"]


class _CutStream(httpx2.SyncByteStream):
    """The opened worker stream raising as sealed_client/opening.py does on a cut or a tampered frame."""

    def __iter__(self) -> Iterator[bytes]:
        yield _events({"model": "chat", "input": "q"}, None).split(b"\n\n", 3)[0] + b"\n\n"
        raise ResponseCorrupted("sealed answer truncated")


def test_a_cut_or_tampered_stream_raises_through_it() -> None:
    answer = drive(serve(_request({}), _plan_of(DOC), send), Gateway(stream=_CutStream))
    seen: list[bytes] = []
    with pytest.raises(ResponseCorrupted):
        for part in answer.iter_bytes():
            seen.append(part)
    kinds = [e["type"] for e in _parsed(b"".join(seen))]
    assert kinds == ["response.created"] and b"response.completed" not in b"".join(seen)


def _plan_of(doc: dict[str, Any]) -> FileSearchPlan:
    request = _request(doc)
    plan = file_search(request, request.read(), "/v1/responses")
    assert isinstance(plan, FileSearchPlan)
    return plan
