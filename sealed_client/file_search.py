"""The Responses API's `file_search` tool through SealedOpenAI (docs/retrieval.md "Sealed mode: file_search").

The chat model's worker holds neither the encoder nor the store's key, and the gateway must not see
the query or the passages, so the client runs the tool itself, in two sealed exchanges it verifies
one by one: a sealed search of each store on the attested encoder's worker (its receipt names the
files the passages came from, checked against the page: sealed_client/retrieval.py), then the sealed
response on the chat model's worker with the passages as a system message before the input, built
as the plaintext path builds it (protocol/openai/file_search.py: the same query, context, item and
citations). The gateway relays ciphertext and sees the store ids only. Nothing of the second
exchange starts before the first verified: a refused search sends no prompt.

Streamed (`stream=true`), the searches are the same and the response is the worker's sealed stream,
turned into the plaintext path's events as it opens (sealed_client/file_search_stream.py)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx2
from pydantic import ValidationError

from protocol.openai.errors import OpenAIError, error_body
from protocol.openai.file_search import RESULTS_INCLUDE, FileSearchTool, Grounding, file_search_tool, search_query
from protocol.openai.responses_request import ResponsesRequest, to_chat
from sealed_client.file_search_stream import GroundedEvents, GroundedStream
from sealed_client.steps import Flow, read

RESPONSES_ENDPOINT = "/v1/responses"


@dataclass(frozen=True)
class FileSearchPlan:
    """A Responses request with a file_search tool, as the client serves it."""

    request: dict[str, Any]  # the caller's request, as sent
    tool: FileSearchTool
    query: str

    def search_bodies(self) -> list[tuple[str, dict[str, Any]]]:
        """(store id, search body) of each store: the search the plaintext path runs, per store."""
        body: dict[str, Any] = {
            "query": self.query,
            "max_num_results": self.tool.max_num_results,
            "rewrite_query": False,
        }
        if self.tool.filters is not None:
            body["filters"] = self.tool.filters
        if self.tool.score_threshold is not None:
            body["ranking_options"] = {"score_threshold": self.tool.score_threshold}
        return [(store_id, dict(body)) for store_id in self.tool.vector_store_ids]

    def grounding(self, pages: list[dict[str, Any]]) -> Grounding:
        """The passages of all stores, best score first, at most max_num_results in all."""
        results = [r for page in pages for r in page.get("data", [])]
        results.sort(key=lambda r: -float(r["score"]))
        include = self.request.get("include") or []
        return Grounding(self.query, results[: self.tool.max_num_results], with_results=RESULTS_INCLUDE in include)

    def grounded_body(self, grounding: Grounding) -> bytes:
        """The request the chat model's worker is sent: the file_search tool and its `include` left out,
        the passages a system message before the input (after `instructions`, as in plaintext mode)."""
        doc = dict(self.request)
        tools = [t for t in doc.get("tools") or [] if t.get("type") != "file_search"]
        if tools:
            doc["tools"] = tools
        else:
            doc.pop("tools", None)
        include = [v for v in doc.get("include") or [] if v != RESULTS_INCLUDE]
        if "include" in doc:
            doc["include"] = include
        context = {"type": "message", "role": "system", "content": grounding.context()}
        given = doc["input"]
        doc["input"] = [
            context,
            *([{"type": "message", "role": "user", "content": given}] if isinstance(given, str) else given),
        ]
        return json.dumps(doc).encode()

    def answer(self, grounding: Grounding, doc: dict[str, Any]) -> dict[str, Any]:
        """The worker's verified response with the tool's output as the plaintext path gives it: the
        `file_search_call` item first, `file_citation` annotations on the message's text."""
        output = [grounding.item()]
        for item in doc.get("output") or []:
            if item.get("type") == "message":
                for part in item.get("content") or []:
                    if part.get("type") == "output_text":
                        part["annotations"] = [
                            *(part.get("annotations") or []),
                            *grounding.citations(part.get("text", "")),
                        ]
            output.append(item)
        return {
            **doc,
            "output": output,
            "tools": self.request.get("tools"),
            "include": self.request.get("include", doc.get("include")),
        }


def file_search_plan(body: bytes) -> FileSearchPlan | None:
    """The plan of a Responses request with a file_search tool; None without one (sealed as any
    request); OpenAIError 400 naming what is refused (before anything is sent)."""
    try:
        doc = json.loads(body)
    except ValueError:
        return None  # not JSON: the worker refuses it as any request
    if (
        not isinstance(doc, dict)
        or not isinstance(doc.get("tools"), list)
        or not any(isinstance(t, dict) and t.get("type") == "file_search" for t in doc["tools"])
    ):
        return None
    try:
        req = ResponsesRequest.model_validate(doc)
    except ValidationError as exc:
        loc = ".".join(str(p) for p in exc.errors()[0].get("loc", ()))
        raise OpenAIError(400, f"invalid request: {loc}", param=loc or None) from None
    tool = file_search_tool(req.tools)
    assert tool is not None
    return FileSearchPlan(doc, tool, search_query(to_chat(req, file_search=True).messages))


def file_search(request: httpx2.Request, body: bytes, endpoint: str) -> FileSearchPlan | httpx2.Response | None:
    """The plan of a Responses request with the file_search tool; its refusal, answered as the
    plaintext path answers it; None for any other request (sealed as usual)."""
    if endpoint != RESPONSES_ENDPOINT:
        return None
    try:
        return file_search_plan(body)
    except OpenAIError as exc:
        return refused(request, exc)


def _search_request(origin: httpx2.Request, store_id: str, body: dict[str, Any]) -> httpx2.Request:
    path = origin.url.path.rstrip("/").removesuffix("/responses") + f"/vector_stores/{store_id}/search"
    return httpx2.Request(
        "POST",
        origin.url.copy_with(path=path),
        json=body,
        headers={"authorization": origin.headers.get("authorization", "")},
    )


def _chat_request(origin: httpx2.Request, body: bytes) -> httpx2.Request:
    headers = {k: v for k, v in origin.headers.items() if k.lower() != "content-length"}
    return httpx2.Request("POST", origin.url, headers=headers, content=body, extensions=origin.extensions)


def refused(request: httpx2.Request, error: OpenAIError) -> httpx2.Response:
    """A request the client refuses itself, answered as the plaintext path would (the SDK raises it)."""
    return httpx2.Response(
        error.status, json=error_body(error.message, error.type, error.code, error.param), request=request
    )


def _whole(response: httpx2.Response, request: httpx2.Request) -> httpx2.Response | None:
    """None for a 200 (read), else the answer as the SDK should see it (an error to raise)."""
    if response.status_code == 200:
        return None
    return httpx2.Response(response.status_code, headers=response.headers, content=response.content, request=request)


def _done(
    request: httpx2.Request, plan: FileSearchPlan, grounding: Grounding, answer: httpx2.Response
) -> httpx2.Response:
    failed = _whole(answer, request)
    if failed is not None:
        return failed
    doc = plan.answer(grounding, answer.json())
    headers = {k: v for k, v in answer.headers.items() if k.lower() not in ("content-length", "content-type")}
    return httpx2.Response(200, headers=headers, json=doc, request=request)


def serve(
    request: httpx2.Request, plan: FileSearchPlan, handle: Callable[[httpx2.Request], Flow[httpx2.Response]]
) -> Flow[httpx2.Response]:
    """Search every store (sealed, verified), then ask the chat model (sealed, verified): a flow
    (sealed_client/steps.py) that sends each exchange through `handle` (the transport's own flow)."""
    pages = []
    for store_id, body in plan.search_bodies():
        page = yield from handle(_search_request(request, store_id, body))
        yield from read(page)
        failed = _whole(page, request)
        if failed is not None:
            return failed
        pages.append(page.json())
    grounding = plan.grounding(pages)
    answer = yield from handle(_chat_request(request, plan.grounded_body(grounding)))
    if answer.status_code == 200 and answer.headers.get("content-type", "").startswith("text/event-stream"):
        # Opened as it comes (sealed_client/opening.py): a cut or a bad receipt raises while it is read.
        stream = answer.stream
        assert isinstance(stream, (httpx2.SyncByteStream, httpx2.AsyncByteStream))
        headers = {k: v for k, v in answer.headers.items() if k.lower() != "content-length"}
        return httpx2.Response(200, headers=headers, stream=GroundedStream(stream, GroundedEvents(plan, grounding)),
                               request=request)
    yield from read(answer)
    return _done(request, plan, grounding, answer)
