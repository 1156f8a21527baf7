"""The tool_choice-auto grammar (protocol/openai/tool_grammar.py) on the default model's real tokens: a
table of answers each grammar takes whole, takes as a complete answer, or refuses at some token."""

from __future__ import annotations

import pytest

from protocol.openai.tool_grammar import auto_tools_constraint

ARGS = {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "f", "strict": True, "parameters": ARGS}},
         {"type": "function", "function": {"name": "g", "parameters": ARGS}}]
MESSAGE = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"], "additionalProperties": False}
F = '<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>'
G_LOOSE = '<tool_call>\n{"name": "g", "arguments": {"z": [true]}}\n</tool_call>'  # g is not strict: any object
GRAMMARS = {
    "parallel": auto_tools_constraint(TOOLS, None, True),
    "one": auto_tools_constraint(TOOLS, None, False),
    "message": auto_tools_constraint(TOOLS, MESSAGE, True),
}
# "open": taken, more may follow (or EOS); "done": a complete answer, nothing else may follow;
# "refused": some token of it is masked out.
CASES = [
    ("parallel", "Plain prose, no call.", "open"),
    ("parallel", "Let me check. " + F, "open"),
    ("parallel", F + "\n" + G_LOOSE, "open"),
    ("parallel", F + "\nand then prose", "refused"),
    ("parallel", '<tool_call>\n{"name": "f", "arguments": {"x": "one"}}', "refused"),  # strict arguments
    ("parallel", '<tool_call>\n{"name": "f", "arguments": {}}', "refused"),  # a required key missing
    ("parallel", '<tool_call>\n{"name": "delete_files", "arguments": {}}', "refused"),  # not an offered tool
    ("one", "Let me check. " + F, "done"),
    ("one", F + "\n" + G_LOOSE, "refused"),  # parallel_tool_calls false: one call and the answer ends
    ("one", "Plain prose, no call.", "open"),
    ("message", '{"a": 1}', "done"),
    ("message", F, "open"),
    ("message", '{"b": 1}', "refused"),
    ("message", "Prose first. " + F, "refused"),
    ("message", '{"a": "1"}', "refused"),
]


def fate(engine, kind: str, text: str) -> str:  # type: ignore[no-untyped-def]
    state = engine.grammars.matcher(GRAMMARS[kind])
    ids = engine.tokenizer.encode(text)
    for i, token in enumerate(ids):
        done = state.advance(token)
        if state.matcher.is_error():
            return "refused"
        if done:
            return "done" if i == len(ids) - 1 else "refused"
    assert state.matcher.is_accepting(), text
    return "open"


@pytest.mark.parametrize(("kind", "text", "expected"), CASES)
def test_the_auto_grammar_takes_and_refuses(engine, kind: str, text: str, expected: str) -> None:  # type: ignore[no-untyped-def]
    assert fate(engine, kind, text) == expected
