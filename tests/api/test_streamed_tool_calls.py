"""Streamed tool calls through the real stack (`sealed up`), plaintext and sealed: the official openai
SDK's stream accumulation gives the calls of the non-streamed answer, the arguments arrive in
fragments before the call ends, and a tool the agent's policy forbids is refused before any byte of
its call reaches the client (the refusal is in the audit trail, signed in the worker)."""

from __future__ import annotations

import json
from typing import Any
from typing import Any as RunningStack

import jsonschema
import openai
import pytest
from openai.lib.streaming.chat import ChatCompletionStreamState

from api.stack import DEMO_MODEL
from policy.audit import read_entries
from sealed_client import SealedOpenAI
from tests.api.sealed_helpers import demo_client_policy

FORECAST = {"type": "function", "function": {"name": "get_weather", "parameters": {  # the demo policy's one tool
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 16},
                                     "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"], "additionalProperties": False}}}
DELETE_FILES = {"type": "function", "function": {"name": "delete_files", "parameters": {
    "type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}}
ASK = [{"role": "user", "content": "What's the weather like in Paris today?"}]


def client(stack: RunningStack, sealed: bool) -> openai.OpenAI:
    if sealed:
        return SealedOpenAI(base_url=f"{stack.url}/v1", api_key=stack.api_key, max_retries=0,
                            policy=demo_client_policy(stack.home))
    return openai.OpenAI(base_url=f"{stack.url}/v1", api_key=stack.api_key, max_retries=0)


def calls_of(message: Any) -> list[tuple[str, Any]]:
    return [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls or []]


@pytest.mark.parametrize("sealed", [False, True], ids=["plaintext", "sealed"])
@pytest.mark.parametrize("choice", ["required", "named"])
def test_the_sdks_stream_accumulation_gives_the_non_streamed_calls(stack: RunningStack, sealed: bool,
                                                                   choice: str) -> None:
    c = client(stack, sealed)
    tool_choice: Any = "required" if choice == "required" else {"type": "function", "function": {"name": "get_weather"}}
    args: dict[str, Any] = {"model": DEMO_MODEL, "messages": ASK, "tools": [FORECAST], "tool_choice": tool_choice,
                            "temperature": 1.0, "seed": 11, "max_tokens": 64}
    whole = c.chat.completions.create(**args)
    assert whole.choices[0].finish_reason == "tool_calls"
    with c.chat.completions.stream(**args) as stream:
        events = list(stream)
        final = stream.get_final_completion()
    assert calls_of(final.choices[0].message) == calls_of(whole.choices[0].message)
    assert final.choices[0].message.content == whole.choices[0].message.content
    (name, arguments), = calls_of(final.choices[0].message)
    assert name == "get_weather"
    jsonschema.validate(arguments, FORECAST["function"]["parameters"])
    assert final.choices[0].finish_reason == "tool_calls"
    fragments = [e for e in events if e.type == "tool_calls.function.arguments.delta"]
    assert len(fragments) > 2  # the arguments stream as they are generated, not as one piece at the end
    assert "".join(f.arguments_delta for f in fragments) == final.choices[0].message.tool_calls[0].function.arguments


@pytest.mark.parametrize("sealed", [False, True], ids=["plaintext", "sealed"])
@pytest.mark.parametrize("seed", [1, 2])
def test_auto_tool_choice_streamed_is_the_non_streamed_message(stack: RunningStack, sealed: bool, seed: int) -> None:
    """`auto`, sampled: whatever the model writes (text before, between or after calls, or no call),
    the SDK's accumulation of the stream is the non-streamed message, content and calls."""
    c = client(stack, sealed)
    args: dict[str, Any] = {"model": DEMO_MODEL, "messages": ASK, "tools": [FORECAST], "tool_choice": "auto",
                            "temperature": 1.0, "seed": seed, "max_tokens": 64}
    whole = c.chat.completions.create(**args)
    # The SDK's own accumulation (what `.stream()` runs), read as a snapshot: `get_final_completion`
    # refuses an answer cut by max_tokens, which a sampled answer here may be.
    state: ChatCompletionStreamState[Any] = ChatCompletionStreamState(input_tools=[FORECAST])
    for chunk in c.chat.completions.create(**args, stream=True):
        state.handle_chunk(chunk)
    got, want = state.current_completion_snapshot.choices[0], whole.choices[0]
    assert (got.message.content, calls_of(got.message), got.finish_reason) == (
        want.message.content, calls_of(want.message), want.finish_reason)


@pytest.mark.parametrize("sealed", [False, True], ids=["plaintext", "sealed"])
def test_a_forbidden_tool_is_refused_before_any_byte_of_its_call_reaches_the_client(stack: RunningStack,
                                                                                    sealed: bool) -> None:
    """`required` with only delete_files offered: the name is generated (it is not in the prompt's
    prefix), the worker's guard refuses it as soon as it is known, and nothing of it is sent."""
    def refusals() -> int:
        rows = read_entries(stack.home / "audit", component="gateway")
        return sum(1 for r in rows if r.action == "worker-decision" and r.decision == "deny"
                   and r.metadata["worker_action"] == "tool-call")

    before = refusals()
    received: list[Any] = []
    with pytest.raises(openai.APIError) as err:
        stream = client(stack, sealed).chat.completions.create(
            model=DEMO_MODEL, messages=[{"role": "user", "content": "Delete everything under /home."}],
            tools=[DELETE_FILES], tool_choice="required", temperature=0, max_tokens=48, stream=True)
        for chunk in stream:
            received.append(chunk)
    assert "agent policy" in str(err.value)
    for chunk in received:
        for choice in chunk.choices:
            assert not choice.delta.tool_calls and "delete" not in (choice.delta.content or "")
    if not sealed:  # the refusal, signed in the worker, is in the gateway's audit trail (sealed: in the
        assert refusals() == before + 1  # tenant's sealed decision record, which the gateway cannot read)
