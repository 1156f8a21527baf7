"""Parameters OpenAI refuses are refused here too, and a cut JSON answer is returned as cut
(protocol/openai/chat.py, completions.py, runner.py, format.py)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from protocol.openai.chat import plan_chat
from protocol.openai.completions import plan_completion
from protocol.openai.errors import OpenAIError
from protocol.openai.format import ChatAnswerShape
from protocol.openai.schemas import ChatCompletionRequest, CompletionRequest

MSGS = [{"role": "user", "content": "hi"}]


def chat(**fields: Any) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"model": "m", "messages": MSGS, **fields})


def plan(req: ChatCompletionRequest) -> Any:
    return plan_chat(req, rid="r", tenant="t", key_id="k", agent_killed=False, default_max_tokens=16)


@pytest.mark.parametrize(("fields", "param"), [
    ({"stream_options": {"include_usage": True}}, "stream_options"),
    ({"stream": False, "stream_options": {"include_usage": False}}, "stream_options"),
    ({"store": True}, "store"),
])
def test_chat_refuses_what_openai_refuses_with_a_400_naming_it(fields: dict[str, Any], param: str) -> None:
    with pytest.raises(OpenAIError) as err:
        plan(chat(**fields))
    assert err.value.status == 400 and err.value.param == param


def test_chat_accepts_stream_options_with_stream_and_store_false() -> None:
    assert plan(chat(stream=True, stream_options={"include_usage": True})).requests
    assert plan(chat(store=False)).requests


def test_completion_refuses_stream_options_without_stream() -> None:
    req = CompletionRequest.model_validate({"model": "m", "prompt": "x", "stream_options": {"include_usage": True}})
    with pytest.raises(OpenAIError) as err:
        plan_completion(req, rid="r", tenant="t", key_id="k")
    assert err.value.status == 400 and err.value.param == "stream_options"


@pytest.mark.parametrize("constrained", [True, False])
def test_a_json_answer_cut_by_the_token_limit_is_returned_as_cut(constrained: bool) -> None:
    shape = ChatAnswerShape(json_mode=True, constrained=constrained)
    cut = '{"name": "Ada", "age": 3'
    message, reason = shape.message(cut, "length")
    assert reason == "length" and message["content"] == cut  # not repaired into '{"name": "Ada", "age": 3}'
    with pytest.raises(json.JSONDecodeError):
        json.loads(message["content"])


def test_a_whole_json_answer_is_returned_unchanged() -> None:
    whole = '{"name": "Ada"}'
    assert ChatAnswerShape(json_mode=True, constrained=True).message(whole, "stop")[0]["content"] == whole
