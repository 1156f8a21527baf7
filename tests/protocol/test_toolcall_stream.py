"""The streamed reading of tool calls (protocol/toolcall_stream.py) agrees with the whole answer's
parser at every point of the answer: the guard judges, and the client is sent, the same calls."""

from __future__ import annotations

import json

import pytest

from protocol.toolcall_stream import outside_content, scan
from protocol.toolcalls import parse_tool_calls


def block(name: str, args: object, close: bool = True) -> str:
    return f'<tool_call>\n{json.dumps({"name": name, "arguments": args})}' + ("\n</tool_call>" if close else "")


ANSWERS = {
    "one call after text": "Let me check. " + block("get_weather", {"city": "Paris"}),
    "two calls": block("a", {"x": [1, {"y": "}"}]}) + "and " + block("b", {}),
    "a list of calls": '<tool_call>[{"name": "a", "arguments": {}}, {"name": "b", "arguments": {"k": 1}}]</tool_call>',
    "name after arguments": '<tool_call>{"arguments": {"q": 1}, "name": "a"}</tool_call>',
    "escaped name and braces in strings": '<tool_call>{"name": "a\\u005fb", "arguments": {"s": "{\\"}"}}</tool_call>',
    "close marker inside a string": '<tool_call>{"name": "a", "arguments": {"s": "x</tool_call>y"}}</tool_call>',
    "parameters": '<tool_call>{"name": "a", "parameters": {"p": true}}</tool_call>',
    "no call": "Just text with < and <tool but no call.",
}


@pytest.mark.parametrize("case", list(ANSWERS))
def test_every_prefix_of_an_answer_scans_to_the_calls_the_parser_reads(case: str) -> None:
    answer = ANSWERS[case]
    for k in range(len(answer) + 1):
        text = answer[:k]
        found = scan(text)
        assert [c for b in found.blocks for c in b.calls()] == list(parse_tool_calls(text).calls), text
        assert "<tool_call>" not in text[:found.content_end]
        for b in found.blocks:
            if b.name is not None:  # streamable: the name is the parser's, whatever comes next
                assert answer[b.args_start] == "{"
                whole = scan(answer).blocks[found.blocks.index(b)]
                assert [c.name for c in whole.calls()] == [b.name] or case == "close marker inside a string"


def test_arguments_grow_monotonically_and_end_as_the_model_wrote_them() -> None:
    answer = "ok " + block("get_weather", {"city": "Paris", "days": [1, 2]})
    sent, last = "", 0
    for k in range(len(answer) + 1):
        text = answer[:k]
        for b in scan(text).blocks:
            if b.name is not None:
                assert b.args_start is not None
                upto = b.args_upto(text)
                assert upto >= last
                sent, last = text[b.args_start:upto], upto
    assert json.loads(sent) == {"city": "Paris", "days": [1, 2]}


def test_content_stops_where_a_block_may_start() -> None:
    assert scan("Hello <tool_ca").content_end == len("Hello ")
    assert scan("Hello <tool_call>").content_end == len("Hello ")
    assert scan("Hello <b>").content_end == len("Hello <b>")


def test_only_a_name_first_object_block_is_streamable() -> None:
    for case in ("a list of calls", "name after arguments"):
        assert all(b.name is None for b in scan(ANSWERS[case]).blocks)
    assert scan('<tool_call>{"name": "a", "arguments": "text"}').blocks[0].name is None
    assert scan(ANSWERS["parameters"]).blocks[0].name == "a"


@pytest.mark.parametrize("answer", [
    "Sure.  " + '<tool_call>\n{"name": "a", "arguments": {}}\n</tool_call>' + "\n\n Done. \n",
    '<tool_call>{"name": "a", "arguments": {}}</tool_call> mid <tool_call>[{"name": "b"}]</tool_call>end<tool_c',
    "  no calls at all, kept as written  ",
    'before <tool_call>{"name": "a", "arguments": {"x": "</tool_call'])
def test_outside_content_only_grows_as_the_answer_grows(answer: str) -> None:
    """What a streamed answer may send of its content at each point is a prefix of the final content,
    so the deltas never have to be taken back."""
    final = outside_content(answer)
    assert "<tool_call>" not in final and not final.endswith((" ", "\n"))
    for k in range(len(answer) + 1):
        assert final.startswith(outside_content(answer[:k], final=False)), k


def test_outside_content_joins_the_pieces_around_calls() -> None:
    call = '<tool_call>{"name": "a", "arguments": {}}</tool_call>'
    assert outside_content("A. " + call + "\nB.\n" + call + call + " C ") == "A.\nB.\nC"
    assert outside_content(call) == ""
