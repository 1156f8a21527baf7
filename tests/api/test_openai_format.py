"""Tool-call parsing, JSON coercion and the streaming hold-back, on their own."""

from __future__ import annotations

import json

from protocol.openai.format import coerce_json, parse_tool_calls, streamable_len, tool_prefix


def test_tool_calls_in_smollm2_hermes_style() -> None:
    text = 'Let me check.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    content, calls = parse_tool_calls(text, {"get_weather"})
    assert content == "Let me check."
    assert calls[0]["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    assert calls[0]["id"].startswith("call_") and calls[0]["type"] == "function"
    # A list of calls in one tag, an unterminated tag, and an unknown tool name.
    _, many = parse_tool_calls('<tool_call>[{"name": "a", "arguments": {}}, {"name": "b", "arguments": {}}]', set())
    assert [c["function"]["name"] for c in many] == ["a", "b"]
    assert parse_tool_calls('<tool_call>{"name": "rm_rf", "arguments": {}}', {"get_weather"})[1] == []
    assert parse_tool_calls("no calls here", {"x"}) == ("no calls here", [])


def test_forced_prefixes() -> None:
    assert tool_prefix("required") == "<tool_call>\n"
    named = tool_prefix({"type": "function", "function": {"name": "f"}})
    assert named.startswith('<tool_call>\n{"name": "f", "arguments": ')
    assert tool_prefix("auto") == "" and tool_prefix(None) == ""


def test_coerce_json_closes_what_the_model_left_open() -> None:
    assert json.loads(coerce_json('{"a": 1} trailing')) == {"a": 1}
    assert json.loads(coerce_json('{"a": {"b": "unterminated')) == {"a": {"b": "unterminated"}}
    assert json.loads(coerce_json('{"a": 1, "b": ')) == {"a": 1}
    assert coerce_json("no json") == "{}"


def test_streaming_holds_back_a_possible_marker() -> None:
    assert streamable_len("Hello there") == len("Hello there")
    assert streamable_len("Hello <tool") == len("Hello ")
    assert streamable_len("Hi <tool_call>{") == len("Hi ")
    assert streamable_len("a < b") == len("a < b")
