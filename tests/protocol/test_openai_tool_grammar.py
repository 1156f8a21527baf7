"""Under tool_choice auto, what the request asks of the answer (strict tools, response_format beside
tools, parallel_tool_calls) becomes one grammar, and invalid combinations are OpenAI's 400s
(protocol/openai/tool_grammar.py, combinations.py). The grammar's behaviour on real tokens is tested in
tests/enclave_worker/engine/test_auto_tool_grammar.py."""

from __future__ import annotations

import json
from typing import Any

import pytest

from protocol.openai.chat import plan_chat
from protocol.openai.errors import OpenAIError
from protocol.openai.schemas import ChatCompletionRequest
from protocol.openai.tool_grammar import call_schema

MSGS = [{"role": "user", "content": "hi"}]
ARGS = {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"], "additionalProperties": False}
STRICT = {"type": "function", "function": {"name": "f", "strict": True, "parameters": ARGS}}
LOOSE = {"type": "function", "function": {"name": "g", "parameters": ARGS}}
FMT = {"type": "json_schema", "json_schema": {"name": "answer", "schema": {"type": "object", "properties": {
    "a": {"type": "integer"}}, "required": ["a"]}}}


def plan(**fields: Any) -> Any:
    req = ChatCompletionRequest.model_validate({"model": "m", "messages": MSGS, **fields})
    return plan_chat(req, rid="r", tenant="t", key_id="k", agent_killed=False, default_max_tokens=16)


def grammar(p: Any) -> str:
    s = p.requests[0].params.structured
    assert s.kind == "lark"
    return str(s.spec)


def test_plain_auto_tools_stay_unconstrained() -> None:
    p = plan(tools=[LOOSE], tool_choice="auto")
    assert not p.requests[0].params.HasField("structured") and p.use_tools and p.prefix == ""


@pytest.mark.parametrize("fields", [
    {"tools": [STRICT]},
    {"tools": [LOOSE], "parallel_tool_calls": False},
    {"tools": [LOOSE], "response_format": FMT},
    {"tools": [LOOSE], "response_format": {"type": "json_object"}, "tool_choice": "auto"},
])
def test_what_auto_must_honour_makes_a_grammar_that_starts_at_the_call_opener(fields: dict[str, Any]) -> None:
    p = plan(**fields)
    g = grammar(p)
    assert p.use_tools and not p.json_mode and p.prefix == "" and p.constrained
    if "response_format" in fields:  # a JSON message or calls, never prose
        assert g.startswith('start: message | "<tool_call>\\n" calls') and "/(?s:.*)/" not in g
        assert "JSON" in json.loads(p.requests[0].messages_json)[0]["content"]
    else:  # free text, and the call's grammar from the first <tool_call> on
        assert g.startswith("start: text | opened calls") and "opened[lazy]: /(?s:.*)<tool_call>\\n/" in g
    one = fields.get("parallel_tool_calls") is False
    assert ('("\\n<tool_call>\\n" call "\\n</tool_call>")*' in g) is not one


def test_only_strict_tools_have_their_arguments_constrained() -> None:
    schema = call_schema([STRICT, LOOSE])
    strict, loose = schema["anyOf"]
    assert strict["properties"] == {"name": {"const": "f"}, "arguments": ARGS}
    assert loose["properties"] == {"name": {"const": "g"}, "arguments": {"type": "object"}}
    assert call_schema([STRICT])["properties"]["name"] == {"const": "f"}


def test_tool_choice_none_with_response_format_is_json_mode() -> None:
    p = plan(tools=[STRICT], tool_choice="none", response_format=FMT)
    assert p.json_mode and not p.use_tools and p.requests[0].params.structured.kind == "json_schema"


@pytest.mark.parametrize(("fields", "param"), [
    ({"tool_choice": "auto"}, "tool_choice"),
    ({"tool_choice": "none"}, "tool_choice"),
    ({"parallel_tool_calls": False}, "parallel_tool_calls"),
    ({"top_logprobs": 2}, "top_logprobs"),
    ({"logprobs": False, "top_logprobs": 2}, "top_logprobs"),
    ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": {}}}}, "response_format.json_schema.name"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "a b"}}}, "response_format.json_schema.name"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "n", "strict": "yes"}}},
     "response_format.json_schema.strict"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "n", "scheme": {}}}},
     "response_format.json_schema.scheme"),
    ({"response_format": {"type": "json_object", "json_schema": {"name": "n"}}}, "response_format.json_schema"),
    ({"tools": [STRICT], "response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": [1]}}},
     "response_format.json_schema.schema"),
    ({"tools": [STRICT], "guided_regex": "[0-9]+"}, "tools"),
    ({"tools": [STRICT], "tool_choice": "auto",
      "response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": {"enum": ["x" * 70000]}}}},
     "tools"),
])
def test_invalid_combinations_are_openais_400s_naming_the_parameter(fields: dict[str, Any], param: str) -> None:
    with pytest.raises(OpenAIError) as err:
        plan(**fields)
    assert err.value.status == 400 and err.value.param == param


def test_valid_combinations_are_accepted() -> None:
    assert plan(logprobs=True, top_logprobs=2).requests
    assert plan(tools=[LOOSE], parallel_tool_calls=True, tool_choice="required").requests
    assert plan(response_format={"type": "json_schema", "json_schema": {"name": "n-1_x", "strict": True,
                                                                         "schema": {}}}).requests


def test_allowed_tools_narrow_the_tools_under_their_mode() -> None:
    allowed = {"type": "allowed_tools", "allowed_tools": {"mode": "required", "tools": [
        {"type": "function", "function": {"name": "g"}}]}}
    p = plan(tools=[STRICT, LOOSE], tool_choice=allowed)
    assert p.prefix == "<tool_call>\n" and p.tool_names == frozenset({"g"})  # required, over g alone
    spec = json.loads(p.requests[0].params.structured.spec)
    assert spec["properties"]["name"] == {"const": "g"}
    auto = {"type": "allowed_tools", "allowed_tools": {"mode": "auto", "tools": [
        {"type": "function", "function": {"name": "f"}}]}}
    p = plan(tools=[STRICT, LOOSE], tool_choice=auto)
    assert p.prefix == "" and p.tool_names == frozenset({"f"}) and grammar(p).startswith("start: text")
    with pytest.raises(OpenAIError) as err:
        plan(tools=[STRICT], tool_choice={"type": "allowed_tools", "allowed_tools": {"mode": "auto", "tools": [
            {"type": "function", "function": {"name": "nope"}}]}})
    assert err.value.param == "tool_choice.allowed_tools.tools"
