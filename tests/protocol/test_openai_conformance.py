"""The rows of docs/gateway.md "Parameter conformance" that no other test covers: OpenAI fields this
server does not serve are refused by the schema (a 400 naming them), the Responses-only ones too, and
the bounded bookkeeping fields are taken."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from protocol.openai.errors import OpenAIError
from protocol.openai.responses_request import ResponsesRequest, to_chat
from protocol.openai.schemas import ChatCompletionRequest

MSGS = [{"role": "user", "content": "hi"}]
NOT_SERVED = {"audio": {"voice": "alloy", "format": "wav"}, "modalities": ["text", "audio"],
              "prediction": {"type": "content", "content": "x"}, "reasoning_effort": "low", "service_tier": "auto",
              "web_search_options": {}, "functions": [{"name": "f"}], "function_call": "auto", "verbosity": "low",
              "prompt_cache_key": "k", "safety_identifier": "s"}


@pytest.mark.parametrize("field", sorted(NOT_SERVED))
def test_chat_fields_this_server_does_not_serve_are_refused_naming_them(field: str) -> None:
    with pytest.raises(ValidationError) as err:
        ChatCompletionRequest.model_validate({"model": "m", "messages": MSGS, field: NOT_SERVED[field]})
    (problem,) = err.value.errors()
    assert problem["type"] == "extra_forbidden" and problem["loc"] == (field,)


@pytest.mark.parametrize(("fields", "param"), [
    ({"top_logprobs": 2}, "top_logprobs"), ({"max_tool_calls": 1}, "max_tool_calls"),
    ({"service_tier": "auto"}, "service_tier"), ({"stream_options": {}}, "stream_options"),
    ({"prompt_cache_key": "k"}, "prompt_cache_key"), ({"safety_identifier": "s"}, "safety_identifier"),
    ({"context_management": []}, "context_management"), ({"prompt": {"id": "p"}}, "prompt"),
])  # `conversation` is served (stored conversations: tests/api/test_conversations.py)
def test_responses_fields_this_server_does_not_serve_are_a_400_naming_them(fields: dict[str, Any], param: str) -> None:
    with pytest.raises(OpenAIError) as err:
        to_chat(ResponsesRequest.model_validate({"model": "m", "input": "hi", **fields}))
    assert err.value.status == 400 and err.value.param == param


def test_truncation_auto_is_refused_and_disabled_taken() -> None:
    assert to_chat(ResponsesRequest.model_validate({"model": "m", "input": "hi", "truncation": "disabled"}))
    with pytest.raises(ValidationError):
        ResponsesRequest.model_validate({"model": "m", "input": "hi", "truncation": "auto"})


def test_metadata_and_user_are_taken_and_bounded() -> None:
    assert ChatCompletionRequest.model_validate({"model": "m", "messages": MSGS, "metadata": {"a": "b"}, "user": "u"})
    with pytest.raises(ValidationError):
        ChatCompletionRequest.model_validate({"model": "m", "messages": MSGS, "user": "u" * 257})
    with pytest.raises(ValidationError):
        ChatCompletionRequest.model_validate({"model": "m", "messages": MSGS, "metadata": {"a": 1}})
