"""SealedOpenAI's file_search (sealed_client/file_search.py): a Responses request with the tool
becomes a search of each store (the plaintext path's search, per store), then a response request
without the tool whose input starts with the passages; the answer gets the file_search_call item and
file_citation annotations. A refused or failed search sends no prompt; a bad tool or a request the
SDK could not have meant is answered 400 naming the field, nothing sent (streamed:
test_sealed_file_search_stream.py)."""

from __future__ import annotations

import json
from typing import Any

import httpx2
import pytest

from protocol.openai.file_search import Grounding
from protocol.sealed import ReceiptInvalid
from sealed_client.file_search import FileSearchPlan, file_search, serve
from sealed_client.steps import drive, send

URL = "http://gw/v1/responses"


def _request(doc: dict[str, Any]) -> httpx2.Request:
    return httpx2.Request("POST", URL, json={"model": "chat", **doc}, headers={"Authorization": "Bearer sk-1"})


def _plan(doc: dict[str, Any]) -> FileSearchPlan:
    request = _request(doc)
    plan = file_search(request, request.read(), "/v1/responses")
    assert isinstance(plan, FileSearchPlan)
    return plan


def _hit(file_id: str, score: float, text: str) -> dict[str, Any]:
    return {
        "file_id": file_id,
        "filename": f"{file_id}.txt",
        "score": score,
        "attributes": {"team": "x"},
        "content": [{"type": "text", "text": text}],
    }


TOOLS: list[dict[str, Any]] = [
    {
        "type": "file_search",
        "vector_store_ids": ["vs-a", "vs-b"],
        "max_num_results": 2,
        "filters": {"type": "eq", "key": "team", "value": "x"},
        "ranking_options": {"score_threshold": 0.1},
    },
    {"type": "function", "name": "lookup", "parameters": {"type": "object"}},
]
PAGES: dict[str, list[dict[str, Any]]] = {
    "vs-a": [_hit("file-1", 0.5, "one"), _hit("file-2", 0.2, "two")],
    "vs-b": [_hit("file-3", 0.9, "three")],
}


class Gateway:
    """Stands in for SealedTransport.handle_request: keeps what is sent, answers as told."""

    def __init__(self, search_status: int = 200, raises: Exception | None = None) -> None:
        self.sent: list[tuple[str, dict[str, Any]]] = []
        self.search_status, self.raises = search_status, raises

    def __call__(self, request: httpx2.Request) -> httpx2.Response:
        body = json.loads(request.read())
        self.sent.append((request.url.path, body))
        if request.url.path.endswith("/search"):
            if self.raises is not None:
                raise self.raises
            store = request.url.path.split("/")[-2]
            return httpx2.Response(
                self.search_status, json={"object": "vector_store.search_results.page", "data": PAGES[store]}
            )
        return httpx2.Response(
            200,
            headers={"x-sealed-receipt": "r"},
            json={
                "object": "response",
                "tools": body.get("tools"),
                "include": body.get("include"),
                "output": [
                    {
                        "type": "message",
                        "role": "assistant",
                        "content": [{"type": "output_text", "text": "It ends.", "annotations": []}],
                    }
                ],
            },
        )


def test_the_tool_becomes_two_sealed_exchanges_and_the_plaintext_output() -> None:
    gateway = Gateway()
    request = _request(
        {
            "input": [{"role": "user", "content": "When?"}],
            "instructions": "Be brief.",
            "tools": TOOLS,
            "include": ["file_search_call.results"],
        }
    )
    plan = file_search(request, request.read(), "/v1/responses")
    assert isinstance(plan, FileSearchPlan)
    answer = drive(serve(request, plan, send), gateway)
    (s1, b1), (s2, b2), (chat_path, chat) = gateway.sent
    assert (s1, s2, chat_path) == ("/v1/vector_stores/vs-a/search", "/v1/vector_stores/vs-b/search", "/v1/responses")
    assert (
        b1
        == b2
        == {
            "query": "When?",
            "max_num_results": 2,
            "rewrite_query": False,
            "filters": {"type": "eq", "key": "team", "value": "x"},
            "ranking_options": {"score_threshold": 0.1},
        }
    )
    # The chat worker gets no file_search tool, no results include, and the two best passages first.
    assert chat["tools"] == [TOOLS[1]] and chat["include"] == [] and chat["instructions"] == "Be brief."
    context, question = chat["input"]
    assert context["role"] == "system" and question == {"role": "user", "content": "When?"}
    assert context["content"].index("[file-3.txt]\nthree") < context["content"].index("[file-1.txt]\none")
    assert "two" not in context["content"]
    doc = answer.json()
    call, message = doc["output"]
    assert call["type"] == "file_search_call" and call["queries"] == ["When?"]
    assert [r["file_id"] for r in call["results"]] == ["file-3", "file-1"]
    assert message["content"][0]["annotations"] == [
        {"type": "file_citation", "index": 8, "file_id": "file-3", "filename": "file-3.txt"},
        {"type": "file_citation", "index": 8, "file_id": "file-1", "filename": "file-1.txt"},
    ]
    assert doc["tools"] == TOOLS and doc["include"] == ["file_search_call.results"]
    assert answer.headers["x-sealed-receipt"] == "r"


def test_a_string_input_and_no_include() -> None:
    gateway = Gateway()
    plan = _plan({"input": "When?", "tools": TOOLS[:1]})
    drive(serve(_request({}), plan, send), gateway)
    chat = gateway.sent[-1][1]
    assert "tools" not in chat and "include" not in chat
    assert chat["input"][1] == {"type": "message", "role": "user", "content": "When?"}
    assert plan.answer(Grounding("q", [], False), {"output": []})["output"][0]["results"] is None


def test_a_refused_search_sends_no_prompt() -> None:
    gateway = Gateway(search_status=404)
    answer = drive(serve(_request({}), _plan({"input": "When?", "tools": TOOLS}), send), gateway)
    assert answer.status_code == 404 and [p for p, _ in gateway.sent] == ["/v1/vector_stores/vs-a/search"]
    gateway = Gateway(raises=ReceiptInvalid("the receipt's file ids are not the files"))
    with pytest.raises(ReceiptInvalid):
        drive(serve(_request({}), _plan({"input": "When?", "tools": TOOLS}), send), gateway)
    assert not [p for p, _ in gateway.sent if p.endswith("/responses")]


@pytest.mark.parametrize(
    ("doc", "param"),
    [
        ({"input": "q", "stream": "maybe", "tools": TOOLS}, "stream"),
        ({"input": "q", "tools": [{**TOOLS[0], "vector_store_ids": []}]}, "tools[0].vector_store_ids"),
        ({"input": "q", "tools": [{**TOOLS[0], "max_num_results": 51}]}, "tools[0].max_num_results"),
        ({"input": "q", "tools": [TOOLS[0], TOOLS[0]]}, "tools[1].type"),
        ({"input": [{"role": "assistant", "content": "hi"}], "tools": TOOLS}, "input"),
        ({"input": "q", "tools": TOOLS, "temperature": 9}, "temperature"),
    ],
)
def test_a_bad_request_is_refused_naming_the_field(doc: dict[str, Any], param: str) -> None:
    request = _request(doc)
    refused = file_search(request, request.read(), "/v1/responses")
    assert isinstance(refused, httpx2.Response) and refused.status_code == 400
    assert json.loads(refused.read())["error"]["param"] == param


def test_other_requests_are_sealed_as_before() -> None:
    for body in (
        b"not json",
        b"[]",
        json.dumps({"model": "m", "input": "q"}).encode(),
        json.dumps({"model": "m", "input": "q", "tools": [TOOLS[1]]}).encode(),
    ):
        assert file_search(httpx2.Request("POST", URL, content=body), body, "/v1/responses") is None
    body = json.dumps({"model": "m", "messages": [], "tools": TOOLS}).encode()
    assert (
        file_search(httpx2.Request("POST", "http://gw/v1/chat/completions", content=body), body, "/v1/chat/completions")
        is None
    )
