"""What an OpenAI request asks the answer to be, as the constraint the engine enforces."""

from __future__ import annotations

import json

import pytest

from protocol.openai.chat import plan_chat
from protocol.openai.completions import plan_completion
from protocol.openai.errors import OpenAIError
from protocol.openai.schemas import ChatCompletionRequest, CompletionRequest
from protocol.sampling import MAX_STRUCTURED_SPEC

MSG = [{"role": "user", "content": "hi"}]
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
    "x": {"type": "integer"}}}}}
OTHER = {"type": "function", "function": {"name": "g"}}


def _plan(**body: object):  # type: ignore[no-untyped-def]
    req = ChatCompletionRequest.model_validate({"model": "m", "messages": MSG, **body})
    return plan_chat(req, rid="r", tenant="t", key_id="k", agent_killed=False, default_max_tokens=16)


def _structured(plan) -> tuple[str, object]:  # type: ignore[no-untyped-def]
    s = plan.requests[0].params.structured
    return s.kind, (json.loads(s.spec) if s.kind == "json_schema" else s.spec)


def test_response_formats_become_json_schemas_and_nothing_is_forced_in_text() -> None:
    schema = {"type": "array", "items": {"type": "integer"}}
    plan = _plan(response_format={"type": "json_schema", "json_schema": {"name": "n", "schema": schema}})
    assert _structured(plan) == ("json_schema", schema) and plan.prefix == "" and plan.shape.streams_text
    assert _structured(_plan(response_format={"type": "json_object"})) == ("json_schema", {"type": "object"})
    assert not _plan().requests[0].params.HasField("structured")
    # a constrained answer is taken as decoded (any top-level type); cut by length, it is repaired
    assert plan.shape.message("[1, 2]", "stop")[0]["content"] == "[1, 2]"


def test_forced_tool_calls_are_one_call_to_an_offered_tool_with_its_arguments_schema() -> None:
    plan = _plan(tools=[TOOL, OTHER], tool_choice="required")
    kind, spec = _structured(plan)
    assert plan.prefix == "<tool_call>\n" and kind == "json_schema"
    assert [c["properties"]["name"] for c in spec["anyOf"]] == [{"const": "f"}, {"const": "g"}]
    assert spec["anyOf"][0]["properties"]["arguments"] == TOOL["function"]["parameters"]
    assert spec["anyOf"][1]["properties"]["arguments"] == {"type": "object"}
    # A named call: the name is in the prefix (the guard knows the call before any argument exists);
    # the grammar is that tool's arguments, then the call's closing brace.
    named_plan = _plan(tools=[TOOL, OTHER], tool_choice={"type": "function", "function": {"name": "f"}})
    assert named_plan.prefix == '<tool_call>\n{"name": "f", "arguments": '
    kind, grammar = _structured(named_plan)
    assert kind == "lark" and str(grammar).startswith('start: arguments "}"')
    assert json.dumps(TOOL["function"]["parameters"])[1:-1] in str(grammar)
    assert not _plan(tools=[TOOL], tool_choice="auto").requests[0].params.HasField("structured")


def test_vllms_guided_extras() -> None:
    assert _structured(_plan(guided_choice=["a.b", "c (d)"])) == ("regex", r"(?:a\.b)|(?:c \(d\))")
    assert _structured(_plan(guided_regex="[0-9]+")) == ("regex", "[0-9]+")
    assert _structured(_plan(guided_json='{"type": "string"}')) == ("json_schema", {"type": "string"})
    req = CompletionRequest.model_validate({"model": "m", "prompt": "x", "guided_choice": ["yes", "no"]})
    assert plan_completion(req, rid="r", tenant="t", key_id="k").requests[0].params.structured.kind == "regex"


@pytest.mark.parametrize("body", [
    {"guided_regex": "a", "guided_choice": ["b"]},
    {"guided_regex": "a", "response_format": {"type": "json_object"}},
    {"guided_json": "{not json"},
    {"guided_json": "[1]"},
    {"response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": [1]}}},
    {"guided_json": {"description": "x" * MAX_STRUCTURED_SPEC}},
])
def test_constraints_that_cannot_be_taken_are_400s(body: dict) -> None:
    with pytest.raises(OpenAIError) as refused:
        _plan(**body)
    assert refused.value.status == 400 and refused.value.param
