"""The Responses API's file_search tool, its protocol side (protocol/openai/file_search.py): the tool's
parameters checked by name, refused where nothing serves it (sealed mode), the passages as context
before the input, and the answer's file_search_call item and file_citation annotations, whole and
streamed, in the shapes the official openai SDK parses."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from protocol.openai.errors import OpenAIError
from protocol.openai.file_search import Grounding, file_search_tool, search_query
from protocol.openai.responses import responses_body, responses_events
from protocol.openai.responses_request import ResponsesRequest, input_messages, to_chat
from protocol.openai.runner import sse

STORE = {"type": "file_search", "vector_store_ids": ["vs-1"]}
RESULTS = [
    {"file_id": "file-a", "filename": "a.txt", "score": 0.9, "attributes": {}, "content": [{"type": "text",
                                                                                              "text": "alpha"}]},
    {"file_id": "file-b", "filename": "b.txt", "score": 0.8, "attributes": {"k": "v"},
     "content": [{"type": "text", "text": "beta"}]},
    {"file_id": "file-a", "filename": "a.txt", "score": 0.7, "attributes": {}, "content": [{"type": "text",
                                                                                              "text": "gamma"}]}]
CHAT = {"choices": [{"index": 0, "message": {"role": "assistant", "content": "Answer."}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}


def req(**fields: Any) -> ResponsesRequest:
    return ResponsesRequest.model_validate({"model": "m", "input": "When?", "tools": [STORE], **fields})


BAD_TOOLS = [
    ("no store ids", {"type": "file_search"}, "tools[0].vector_store_ids"),
    ("empty store ids", {**STORE, "vector_store_ids": []}, "tools[0].vector_store_ids"),
    ("three store ids", {**STORE, "vector_store_ids": ["a", "b", "c"]}, "tools[0].vector_store_ids"),
    ("repeated store id", {**STORE, "vector_store_ids": ["a", "a"]}, "tools[0].vector_store_ids"),
    ("store id not a string", {**STORE, "vector_store_ids": [7]}, "tools[0].vector_store_ids"),
    ("zero results", {**STORE, "max_num_results": 0}, "tools[0].max_num_results"),
    ("51 results", {**STORE, "max_num_results": 51}, "tools[0].max_num_results"),
    ("results as text", {**STORE, "max_num_results": "5"}, "tools[0].max_num_results"),
    ("results as bool", {**STORE, "max_num_results": True}, "tools[0].max_num_results"),
    ("filters not an object", {**STORE, "filters": "x"}, "tools[0].filters"),
    ("threshold above 1", {**STORE, "ranking_options": {"score_threshold": 2}},
     "tools[0].ranking_options.score_threshold"),
    ("hybrid search", {**STORE, "ranking_options": {"hybrid_search": {}}}, "tools[0].ranking_options"),
    ("unknown field", {**STORE, "vector_stores": ["x"]}, "tools[0].vector_stores"),
]


@pytest.mark.parametrize(("case", "tool", "param"), BAD_TOOLS, ids=[c[0] for c in BAD_TOOLS])
def test_a_bad_file_search_tool_is_a_400_naming_the_field(case: str, tool: dict[str, Any], param: str) -> None:
    with pytest.raises(OpenAIError) as err:
        file_search_tool(req(tools=[tool]).tools)
    assert err.value.status == 400 and err.value.param == param, case


def test_two_file_search_tools_are_refused() -> None:
    with pytest.raises(OpenAIError) as err:
        file_search_tool(req(tools=[STORE, STORE]).tools)
    assert err.value.param == "tools[1].type"


def test_the_tool_is_read_with_openais_defaults() -> None:
    tool = file_search_tool(req(tools=[{"type": "function", "name": "f"}, {**STORE, "filters": {"type": "eq",
        "key": "k", "value": "v"}, "ranking_options": {"ranker": "auto", "score_threshold": 0.5}}]).tools)
    assert tool is not None and tool.vector_store_ids == ("vs-1",) and tool.max_num_results == 10
    assert tool.score_threshold == 0.5 and tool.filters == {"type": "eq", "key": "k", "value": "v"}
    assert tool.param == "tools[1]"


def test_where_nothing_serves_the_tool_it_is_refused_by_name() -> None:
    """Sealed mode's worker calls to_chat(req): the tool is a 400 naming it, never silently dropped
    (SealedOpenAI serves it and sends the worker a request without it: sealed_client/file_search.py)."""
    with pytest.raises(OpenAIError, match="SealedOpenAI itself in sealed mode") as err:
        to_chat(req())
    assert err.value.param == "tools[0].type"


def test_served_the_tool_leaves_the_chat_request_and_a_function_tool_stays() -> None:
    chat = to_chat(req(tools=[STORE, {"type": "function", "name": "f"}]), file_search=True)
    assert chat.tools is not None and [t.function.name for t in chat.tools] == ["f"]
    assert to_chat(req(), file_search=True).tools is None


def test_the_results_include_is_accepted_only_beside_the_tool() -> None:
    to_chat(req(include=["file_search_call.results"]), file_search=True)
    with pytest.raises(OpenAIError) as err:
        to_chat(req(tools=None, include=["file_search_call.results"]))
    assert err.value.param == "include"
    with pytest.raises(OpenAIError) as err:
        to_chat(req(include=["file_search_call.results", "message.output_text.logprobs"]), file_search=True)
    assert err.value.param == "include"


def test_the_query_is_the_latest_user_text_and_there_must_be_one() -> None:
    chat = to_chat(req(input=[{"role": "user", "content": "first"}, {"role": "assistant", "content": "a"},
                              {"role": "user", "content": "second"}]), file_search=True)
    assert search_query(chat.messages) == "second"
    with pytest.raises(OpenAIError) as err:
        search_query(to_chat(req(input=[{"role": "developer", "content": "x"}]), file_search=True).messages)
    assert err.value.param == "input"


def test_the_passages_go_before_the_input_labelled_with_their_files() -> None:
    grounding = Grounding("When?", RESULTS, with_results=False)
    chat = grounding.ground(to_chat(req(instructions="Be brief."), file_search=True), after_instructions=True)
    roles = [m.role for m in chat.messages]
    assert roles == ["system", "system", "user"] and chat.messages[0].text() == "Be brief."
    context = chat.messages[1].text()
    assert "[a.txt]\nalpha" in context and "[b.txt]\nbeta" in context and "[a.txt]\ngamma" in context
    empty = Grounding("When?", [], with_results=False).ground(to_chat(req(), file_search=True), False)
    assert [m.role for m in empty.messages] == ["system", "user"] and "no passages" in empty.messages[0].text()


def test_the_answer_has_the_call_item_then_a_message_citing_each_file_given_once() -> None:
    doc = responses_body(req(), CHAT, {"created": 1}, Grounding("When?", RESULTS, with_results=False))
    call, message = doc["output"]
    assert call["type"] == "file_search_call" and call["id"].startswith("fs_") and call["queries"] == ["When?"]
    assert call["status"] == "completed" and call["results"] is None
    assert message["content"][0]["annotations"] == [
        {"type": "file_citation", "index": len("Answer."), "file_id": "file-a", "filename": "a.txt"},
        {"type": "file_citation", "index": len("Answer."), "file_id": "file-b", "filename": "b.txt"}]
    parsed = Response.model_validate({**doc, "usage": None})  # the SDK's own types (usage: not this test's)
    assert parsed.output[0].type == "file_search_call"
    with_results = responses_body(req(), CHAT, {"created": 1}, Grounding("When?", RESULTS, with_results=True))
    results = with_results["output"][0]["results"]
    assert [(r["file_id"], r["text"]) for r in results] == [("file-a", "alpha"), ("file-b", "beta"),
                                                            ("file-a", "gamma")]
    parsed = Response.model_validate({**with_results, "usage": None})
    assert parsed.output[0].results[1].attributes == {"k": "v"}  # type: ignore[union-attr]


def test_a_past_search_in_the_input_is_no_message() -> None:
    assert input_messages([{"type": "file_search_call", "id": "fs_1", "status": "completed", "queries": ["q"],
                            "results": None}, {"role": "user", "content": "hi"}]) == [
        {"role": "user", "content": "hi"}]


async def _events(grounding: Grounding) -> list[dict[str, Any]]:
    async def chat() -> AsyncIterator[bytes]:
        yield sse({"choices": [{"index": 0, "delta": {"content": "Ans"}, "finish_reason": None}]})
        yield sse({"choices": [{"index": 0, "delta": {"content": "wer."}, "finish_reason": "stop"}]})
        yield sse({"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}})

    return [json.loads(raw.decode().split("data: ", 1)[1])
            async for raw in responses_events(req(stream=True), chat(), {}, grounding=grounding)]


def test_streamed_the_search_events_come_first_and_the_citations_before_the_text_is_done() -> None:
    events = asyncio.run(_events(Grounding("When?", RESULTS, with_results=False)))
    assert [e["type"] for e in events] == [
        "response.created", "response.in_progress", "response.output_item.added",
        "response.file_search_call.in_progress", "response.file_search_call.searching",
        "response.file_search_call.completed", "response.output_item.done",
        "response.output_item.added", "response.content_part.added",
        "response.output_text.delta", "response.output_text.delta",
        "response.output_text.annotation.added", "response.output_text.annotation.added",
        "response.output_text.done", "response.content_part.done", "response.output_item.done", "response.completed"]
    adapter: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)
    for event in events:  # each one is an event the SDK knows (usage: not this test's)
        adapter.validate_python({**event, "response": {**event["response"], "usage": None}} if "response" in event
                                else event)
    added = [e for e in events if e["type"] == "response.output_text.annotation.added"]
    assert [(e["output_index"], e["annotation_index"], e["annotation"]["file_id"]) for e in added] == [
        (1, 0, "file-a"), (1, 1, "file-b")]
    assert all(e["annotation"]["index"] == len("Answer.") for e in added)
    final = events[-1]["response"]
    assert [o["type"] for o in final["output"]] == ["file_search_call", "message"]
    assert len(final["output"][1]["content"][0]["annotations"]) == 2
