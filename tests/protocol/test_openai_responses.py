"""The Responses API over the chat pipeline (protocol/openai/responses_request.py, responses.py):
each request becomes the chat request it means, every parameter this server does not serve is a
400 naming it, and a streamed chat answer becomes the Responses events in the SDK's order."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from protocol.openai.errors import OpenAIError
from protocol.openai.responses import responses_body, responses_events
from protocol.openai.responses_request import ResponsesRequest, conversation_id, to_chat
from protocol.openai.runner import sse


def req(**fields: Any) -> ResponsesRequest:
    return ResponsesRequest.model_validate({"model": "m", "input": "hi", **fields})


def test_a_request_becomes_the_chat_request_it_means() -> None:
    chat = to_chat(req(
        instructions="Be brief.", max_output_tokens=9, temperature=0.5, tool_choice={"type": "function", "name": "f"},
        tools=[{"type": "function", "name": "f", "parameters": {"type": "object"}}],
        input=[{"role": "user", "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}]},
               {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
               {"type": "function_call", "call_id": "c2", "name": "f", "arguments": "{\"x\": 1}"},
               {"type": "function_call_output", "call_id": "c1", "output": "ok"}],
        text={"format": {"type": "json_schema", "name": "p", "schema": {"type": "object"}, "strict": True}}))
    msgs = [m.model_dump(exclude_none=True) for m in chat.messages]
    assert msgs[0] == {"role": "system", "content": "Be brief."} and msgs[1] == {"role": "user", "content": "ab"}
    assert [c["id"] for c in msgs[2]["tool_calls"]] == ["c1", "c2"]  # parallel calls: one assistant turn
    assert msgs[3] == {"role": "tool", "content": "ok", "tool_call_id": "c1"}
    assert chat.max_completion_tokens == 9 and chat.temperature == 0.5
    assert chat.tool_choice is not None and chat.tools is not None and chat.tools[0].function.name == "f"
    assert chat.response_format is not None and chat.response_format.json_schema == {
        "name": "p", "schema": {"type": "object"}, "strict": True}


@pytest.mark.parametrize(("fields", "param"), [
    ({"reasoning": {"effort": "low"}}, "reasoning"),
    ({"include": ["message.output_text.logprobs"]}, "include"),
    ({"include": ["reasoning.encrypted_content", "file_search_call.results"]}, "include"),
    ({"include": "message.output_text.logprobs"}, "include"),
    ({"include": [7]}, "include"),
    ({"background": True}, "background"),
    ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
    ({"tools": [{"type": "function", "name": "f", "defer_loading": True}]}, "tools[0].defer_loading"),
    ({"input": [{"type": "input_image", "image_url": "x"}]}, "input[0].type"),
    ({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]}, "input[0].content[0].type"),
    ({"input": [{"role": "tool", "content": "x"}]}, "input[0].role"),
    ({"text": {"format": {"type": "grammar"}}}, "text.format"),
    ({"text": {"verbosity": "low"}}, "text.verbosity"),
    ({"tool_choice": {"type": "file_search"}}, "tool_choice"),
])
def test_what_is_not_served_is_a_400_naming_it(fields: dict[str, Any], param: str) -> None:
    with pytest.raises(OpenAIError) as err:
        to_chat(req(**fields))
    assert err.value.status == 400 and err.value.param == param


@pytest.mark.parametrize("fields", [{"conversation": 7}, {"conversation": {"id": "c", "x": 1}},
                                    {"conversation": ""}, {"conversation": "c", "previous_response_id": "r"}])
def test_a_conversation_parameter_of_another_shape_is_a_400(fields: dict[str, Any]) -> None:
    with pytest.raises(OpenAIError) as err:
        conversation_id(req(**fields))
    assert err.value.param == "conversation"
    assert conversation_id(req(conversation={"id": "conv_1"})) == conversation_id(req(conversation="conv_1"))


def test_an_empty_include_asks_for_nothing_and_is_accepted() -> None:
    """The OpenAI Agents SDK sends `include: []` on every request of its default Responses model."""
    assert to_chat(req(include=[])) == to_chat(req())


def test_unknown_fields_are_refused_by_the_schema() -> None:
    with pytest.raises(ValueError, match="not_a_field"):
        req(not_a_field=1)


CHAT = [
    {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]},
    {"choices": [{"index": 0, "delta": {"content": "Let me "}, "finish_reason": None}]},
    {"choices": [{"index": 0, "delta": {"content": "check."}, "finish_reason": None}]},
    {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                                                        "function": {"name": "f", "arguments": ""}}]}}]},
    {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": "{\"a\": "}}]}}]},
    {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": "1}"}}]}}]},
    {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
    {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12}},
]


async def _chat() -> AsyncIterator[bytes]:
    for doc in CHAT:
        yield sse(doc)
    yield b"data: [DONE]\n\n"


async def _events() -> list[dict[str, Any]]:
    out = []
    async for raw in responses_events(req(stream=True), _chat(), {"created": 1}):
        event, data = raw.decode().strip().split("\n")
        doc = json.loads(data[len("data: "):])
        assert event == f"event: {doc['type']}"
        out.append(doc)
    return out


def test_streamed_chat_becomes_the_sdks_events_in_order() -> None:
    events = asyncio.run(_events())
    assert [e["type"] for e in events] == [
        "response.created", "response.in_progress",
        "response.output_item.added", "response.content_part.added",
        "response.output_text.delta", "response.output_text.delta", "response.output_text.done",
        "response.content_part.done", "response.output_item.done",
        "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.delta", "response.function_call_arguments.done",
        "response.output_item.done", "response.completed"]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    final = events[-1]["response"]
    assert final["status"] == "completed" and final["usage"]["output_tokens"] == 7
    message, call = final["output"]
    assert message["content"][0]["text"] == "Let me check."
    assert (call["name"], call["call_id"], call["arguments"]) == ("f", "call_1", '{"a": 1}')
    assert len({e["response"]["id"] for e in events if "response" in e}) == 1


def test_a_cut_answer_is_incomplete_and_a_call_held_for_approval_too() -> None:
    for reason, why in (("length", "max_output_tokens"), ("requires_approval", "content_filter")):
        chat = {"choices": [{"index": 0, "message": {"role": "assistant", "content": "x"}, "finish_reason": reason}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}
        doc = responses_body(req(), chat, {"created": 1})
        assert doc["status"] == "incomplete" and doc["incomplete_details"] == {"reason": why}


def test_a_failure_after_the_stream_started_is_an_error_event_the_sdk_raises() -> None:
    async def chat() -> AsyncIterator[bytes]:
        yield sse({"error": {"message": "tool call refused", "type": "permission_error", "code": "denied"}})

    async def run() -> list[dict[str, Any]]:
        return [json.loads(raw.decode().split("data: ", 1)[1])
                async for raw in responses_events(req(stream=True), chat(), {})]

    *_, last = asyncio.run(run())
    assert last["type"] == "error" and last["message"] == "tool call refused"
    assert last["error"]["code"] == "denied"  # a top-level "error" object: the openai SDK raises APIError
