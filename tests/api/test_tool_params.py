"""Under tool_choice auto, through the openai SDK against `sealed up`: strict tool arguments follow
their schema, parallel_tool_calls false gives exactly one call, and response_format beside tools gives
either calls or a message valid for the format (protocol/openai/tool_grammar.py). The 135M model is
steered into calling with a conversation that already holds calls of the same shape (its choice to
call is not under test); the same request without the parameter shows what it would do unconstrained,
so each test can fail."""

from __future__ import annotations

import json
from typing import Any
from typing import Any as RunningStack

import jsonschema
import openai
import pytest

from api.stack import DEMO_MODEL

ARGS = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 16},
                                         "unit": {"enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"], "additionalProperties": False}


def weather(strict: bool | None = None) -> dict[str, Any]:
    fn: dict[str, Any] = {"name": "get_weather", "description": "Get the current weather in a city", "parameters": ARGS}
    if strict is not None:
        fn["strict"] = strict
    return {"type": "function", "function": fn}


def call(i: int, city: str) -> dict[str, Any]:  # the history's calls leave out "unit": copied, they break the schema
    return {"id": f"call_{i}", "type": "function", "function": {"name": "get_weather",
                                                                "arguments": json.dumps({"city": city})}}


HISTORY = [
    {"role": "user", "content": "What is the weather in Paris and in Rome?"},
    {"role": "assistant", "content": None, "tool_calls": [call(1, "Paris"), call(2, "Rome")]},
    {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    {"role": "tool", "tool_call_id": "call_2", "content": "rain"},
    {"role": "user", "content": "What is the weather in Berlin and in Oslo?"},
]


def client(stack: RunningStack) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{stack.url}/v1", api_key=stack.api_key, max_retries=0, timeout=300)


def calls(stack: RunningStack, **kw: Any) -> tuple[list[Any], Any]:
    r = client(stack).chat.completions.create(model=DEMO_MODEL, messages=HISTORY, temperature=0, max_tokens=96, **kw)
    return list(r.choices[0].message.tool_calls or []), r.choices[0]


def test_strict_arguments_follow_the_schema_under_auto(stack: RunningStack) -> None:
    free, _ = calls(stack, tools=[weather()])
    assert free, "the conversation no longer steers the model into calling"
    assert not all(json.loads(c.function.arguments).get("unit") for c in free)  # unconstrained: it copies the history
    strict, choice = calls(stack, tools=[weather(strict=True)], tool_choice="auto")
    assert strict and choice.finish_reason == "tool_calls"
    for c in strict:
        jsonschema.validate(json.loads(c.function.arguments), ARGS)


def test_parallel_tool_calls_false_is_exactly_one_call(stack: RunningStack) -> None:
    free, _ = calls(stack, tools=[weather()], parallel_tool_calls=True)
    assert len(free) > 1, "unconstrained, the model calls once per city as the history does"
    one, choice = calls(stack, tools=[weather()], parallel_tool_calls=False)
    assert len(one) == 1 and choice.finish_reason == "tool_calls"
    streamed = list(client(stack).chat.completions.create(
        model=DEMO_MODEL, messages=HISTORY, temperature=0, max_tokens=96, tools=[weather()],
        parallel_tool_calls=False, stream=True))
    indexes = {tc.index for ch in streamed if ch.choices and ch.choices[0].delta.tool_calls
               for tc in ch.choices[0].delta.tool_calls}
    assert indexes == {0}


ANSWER = {"type": "object", "properties": {"answer": {"type": "string", "maxLength": 40}},
          "required": ["answer"], "additionalProperties": False}


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_response_format_beside_tools_is_a_call_or_a_valid_message(stack: RunningStack, seed: int) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": ANSWER, "strict": True}}
    r = client(stack).chat.completions.create(
        model=DEMO_MODEL, temperature=1.0, seed=seed, max_tokens=64, tools=[weather()], response_format=fmt,
        messages=[{"role": "user", "content": "Say hello."}])
    choice = r.choices[0]
    if choice.message.tool_calls:
        assert choice.finish_reason == "tool_calls" and not choice.message.content
        for c in choice.message.tool_calls:
            assert c.function.name == "get_weather" and isinstance(json.loads(c.function.arguments), dict)
    elif choice.finish_reason == "stop":
        jsonschema.validate(json.loads(choice.message.content), ANSWER)
    else:  # cut by max_tokens: returned as cut, still a prefix of a valid document
        assert choice.finish_reason == "length" and choice.message.content.startswith("{")


@pytest.mark.parametrize(("body", "param"), [
    ({"parallel_tool_calls": False}, "parallel_tool_calls"),
    ({"tool_choice": "auto"}, "tool_choice"),
    ({"top_logprobs": 2}, "top_logprobs"),
    ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
])
def test_invalid_combinations_are_400s_naming_the_parameter(stack: RunningStack, body: dict[str, Any],
                                                              param: str) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        client(stack).chat.completions.create(model=DEMO_MODEL, messages=[{"role": "user", "content": "hi"}],
                                              max_tokens=4, **body)
    assert err.value.body["param"] == param  # type: ignore[index]
