"""The Responses API (POST /v1/responses) through the real stack with the official openai SDK,
plaintext and sealed (SealedOpenAI): text, streamed events, a function tool round trip,
`text.format` json_schema, and a 400 naming each parameter this server does not serve."""

from __future__ import annotations

import json
from typing import Any
from typing import Any as RunningStack

import jsonschema
import openai
import pytest

from api.stack import DEMO_MODEL
from sealed_client import SealedOpenAI
from tests.api.sealed_helpers import demo_client_policy

WEATHER = {"type": "function", "name": "get_weather", "parameters": {  # the demo policy's one tool
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 16}}, "required": ["city"],
    "additionalProperties": False}}
PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                          "age": {"type": "integer", "minimum": 0, "maximum": 120}},
          "required": ["name", "age"], "additionalProperties": False}
MODES = [False, True]


def client(stack: RunningStack, sealed: bool) -> openai.OpenAI:
    if sealed:
        return SealedOpenAI(base_url=f"{stack.url}/v1", api_key=stack.api_key, max_retries=0,
                            policy=demo_client_policy(stack.home))
    return openai.OpenAI(base_url=f"{stack.url}/v1", api_key=stack.api_key, max_retries=0)


@pytest.mark.parametrize("sealed", MODES, ids=["plaintext", "sealed"])
def test_text_whole_and_streamed(stack: RunningStack, sealed: bool) -> None:
    c = client(stack, sealed)
    args: dict[str, Any] = {"model": DEMO_MODEL, "input": "What is the capital of France?",
                            "instructions": "Answer briefly.", "temperature": 0, "max_output_tokens": 16}
    whole = c.responses.create(**args)
    assert whole.object == "response" and whole.output_text
    assert whole.status in ("completed", "incomplete") and whole.usage.output_tokens > 0
    with c.responses.stream(**args) as stream:
        events = list(stream)
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    # Cut by max_output_tokens, the answer ends `incomplete` (as OpenAI's does; the SDK's
    # get_final_response wants `completed`, so the text is read from the last event).
    assert kinds[-1] == ("response.completed" if whole.status == "completed" else "response.incomplete")
    assert events[-1].response.output[0].content[0].text == whole.output_text  # greedy: the same answer
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == whole.output_text
    assert kinds.count("response.output_text.delta") > 1


@pytest.mark.parametrize("sealed", MODES, ids=["plaintext", "sealed"])
def test_a_function_tool_round_trip(stack: RunningStack, sealed: bool) -> None:
    c = client(stack, sealed)
    ask = [{"role": "user", "content": "What's the weather in Paris?"}]
    first = c.responses.create(model=DEMO_MODEL, input=ask, tools=[WEATHER], tool_choice="required",
                               temperature=0, max_output_tokens=48)
    (call,) = [o for o in first.output if o.type == "function_call"]
    assert call.name == "get_weather" and "city" in json.loads(call.arguments)
    with c.responses.stream(model=DEMO_MODEL, input=ask, tools=[WEATHER], tool_choice="required", temperature=0,
                            max_output_tokens=48) as stream:
        deltas = [e.delta for e in stream if e.type == "response.function_call_arguments.delta"]
        streamed = stream.get_final_response()
    (scall,) = [o for o in streamed.output if o.type == "function_call"]
    assert (scall.name, json.loads(scall.arguments)) == (call.name, json.loads(call.arguments))
    assert len(deltas) > 1 and "".join(deltas) == scall.arguments
    follow = c.responses.create(model=DEMO_MODEL, temperature=0, max_output_tokens=16, tools=[WEATHER],
                                tool_choice="none", input=[
                                    *ask, call.model_dump(exclude_none=True),
                                    {"type": "function_call_output", "call_id": call.call_id,
                                     "output": '{"temperature_c": 21}'}])
    assert follow.output_text


@pytest.mark.parametrize("sealed", MODES, ids=["plaintext", "sealed"])
def test_text_format_json_schema_is_enforced(stack: RunningStack, sealed: bool) -> None:
    c = client(stack, sealed)
    fmt = {"format": {"type": "json_schema", "name": "person", "schema": PERSON, "strict": True}}
    for stream in (False, True):
        if stream:
            with c.responses.stream(model=DEMO_MODEL, input="Invent a person.", text=fmt, temperature=1.0,
                                    max_output_tokens=64) as s:
                r = s.get_final_response()
        else:
            r = c.responses.create(model=DEMO_MODEL, input="Invent a person.", text=fmt, temperature=1.0,
                                   max_output_tokens=64)
        jsonschema.validate(json.loads(r.output_text), PERSON)


@pytest.mark.parametrize("sealed", MODES, ids=["plaintext", "sealed"])
@pytest.mark.parametrize(("param", "value"), [("reasoning", {"effort": "low"}), ("background", True),
                                              ("tools", [{"type": "web_search"}])])
def test_unsupported_features_are_a_400_naming_them(stack: RunningStack, sealed: bool, param: str,
                                                    value: Any) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        client(stack, sealed).responses.create(model=DEMO_MODEL, input="hi", max_output_tokens=4,
                                               **{param: value})
    assert (err.value.body or {}).get("param", "").startswith(param)
