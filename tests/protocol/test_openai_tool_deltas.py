"""Streamed tool calls in OpenAI's delta shape (protocol/openai/tool_deltas.py): accumulated as the
openai SDK does, they are the calls of the whole answer, however the answer was chunked."""

from __future__ import annotations

import json
from typing import Any

import pytest

from protocol.openai.format import parse_tool_calls
from protocol.openai.tool_deltas import ToolCallDeltas

NAMED = '<tool_call>\n{"name": "get_weather", "arguments": '


def block(name: str, args: object) -> str:
    return f'<tool_call>\n{json.dumps({"name": name, "arguments": args})}\n</tool_call>'


def accumulate(deltas: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What the SDK's stream accumulation does with tool-call deltas (by index, arguments appended)."""
    calls: dict[int, dict[str, Any]] = {}
    for d in deltas:
        call = calls.setdefault(d["index"], {"id": None, "name": "", "arguments": ""})
        call["id"] = d.get("id") or call["id"]
        call["name"] += d.get("function", {}).get("name", "")
        call["arguments"] += d.get("function", {}).get("arguments", "")
    return [calls[i] for i in sorted(calls)]


def stream(answer: str, step: int, prefix: str = "", tools: frozenset[str] = frozenset({"get_weather", "a"})
           ) -> tuple[str, list[dict[str, Any]], ToolCallDeltas]:
    t = ToolCallDeltas(prefix, tools)
    content, deltas = "", []
    for k in range(step, len(answer) + step, step):
        c, d = t.feed(answer[:k], k >= len(answer))
        content, deltas = content + c, deltas + d
    return content, deltas, t


CASES = [
    ("", "Let me look. " + block("get_weather", {"city": "Paris", "unit": "celsius"})),
    ("", block("get_weather", {"city": "Oslo"}) + block("a", {"n": [1, 2]})),
    ("", '<tool_call>[{"name": "a", "arguments": {}}, {"name": "get_weather", "arguments": {"city": "X"}}]'),
    ("", block("not_offered", {}) + block("a", {})),
    (NAMED, '{"city": "Rome"}}\n</tool_call>'),
    (NAMED, '{"city": "Ro'),  # cut off by max_tokens: repaired as the whole answer's parser repairs it
    # Text after and between calls streams too (it was dropped from streamed answers before).
    ("", "Checking.  \n" + block("get_weather", {"city": "Oslo"}) + "\n\nDone: it is sunny.\n"),
    ("", block("a", {}) + " then " + block("get_weather", {"city": "Rome"}) + " x < y <to"),
    ("", block("not_offered", {}) + "between " + block("a", {}) + "\n"),
    (NAMED, '{"city": "Rome"}}\n</tool_call>\nIt is sunny in Rome.'),
]


@pytest.mark.parametrize("step", [1, 4, 1000])
@pytest.mark.parametrize(("prefix", "answer"), CASES)
def test_accumulated_deltas_are_the_whole_answers_calls(prefix: str, answer: str, step: int) -> None:
    content, deltas, t = stream(answer, step, prefix)
    whole_content, whole = parse_tool_calls(prefix + answer, {"get_weather", "a"})
    assert (content or None) == whole_content  # the content too, as the SDK accumulates it
    got = accumulate(deltas)
    assert [(c["name"], json.loads(c["arguments"])) for c in got] == [
        (c["function"]["name"], json.loads(c["function"]["arguments"])) for c in whole]
    assert all(c["id"].startswith("call_") for c in got) and t.count == len(whole)
    assert "<tool" not in content and "get_weather" not in content


def test_a_name_first_call_is_sent_name_first_then_in_fragments() -> None:
    answer = block("get_weather", {"city": "Paris", "unit": "celsius"})
    _, deltas, _ = stream(answer, 3)
    assert deltas[0]["function"] == {"name": "get_weather", "arguments": ""} and deltas[0]["type"] == "function"
    assert len(deltas) > 3 and all(set(d) == {"index", "function"} and set(d["function"]) == {"arguments"}
                                   for d in deltas[1:])


@pytest.mark.parametrize("answer", ["No tools needed <b>here</b>.", " Spaces kept \n", "Not <tool_ca"])
def test_an_answer_without_calls_is_content(answer: str) -> None:
    for step in (1, 2, 1000):
        content, deltas, t = stream(answer, step)
        assert deltas == [] and t.count == 0
        assert content == answer


def test_text_after_a_call_streams_as_it_is_generated() -> None:
    """Not held to the end: once the call is sent, what follows its block leaves as it comes (less
    whitespace that a later block or the end could trim)."""
    t = ToolCallDeltas("", frozenset({"a"}))
    answer = "Sure. " + block("a", {}) + "\nIt is done. More"
    content, _ = t.feed(answer, False)
    assert content == "Sure.\nIt is done. More"
    assert t.feed(answer + "  ", False)[0] == ""  # trailing whitespace held
    assert t.feed(answer + "  text", False)[0] == "  text"
    assert t.feed(answer + "  text\n", True)[0] == ""
