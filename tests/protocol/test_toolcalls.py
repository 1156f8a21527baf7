"""One tool-call parser for the in-enclave guard and the gateway (issue #12): whatever the gateway
would hand the client as a tool call, the guard has checked, whether the call was cut off by
max_tokens, arrived split over stream chunks, or came with another call in the same answer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from enclave_worker.guard import GuardRefusal, WorkerGuard, load_policy_set
from policy.documents import sign_policy_document
from protocol.openai.format import ChatAnswerShape
from protocol.toolcalls import GeneratedToolCall, parse_tool_calls, strip_tool_calls

POLICY = {
    "policy_id": "acme-policy", "version": 1, "tenant": "acme",
    "agents": {"key_a": {"tools": {"get_weather": {"args_schema": {"type": "object", "required": ["city"]}}},
                         "max_calls_per_request": 4, "max_calls_per_session": 1000}},
}
TOOLS = frozenset({"get_weather", "delete_files"})
FORCED_DELETE = '<tool_call>\n{"name": "delete_files", "arguments": '  # the gateway's named tool_choice prefix


def block(name: str, args: object, close: bool = True) -> str:
    return f'<tool_call>\n{json.dumps({"name": name, "arguments": args})}' + ("\n</tool_call>" if close else "")


# (case, assistant prefix, answer, the calls both sides must see)
ANSWERS = [
    ("truncated", "", '<tool_call>{"name":"delete_files","arguments":{"path":"/home',
     [("delete_files", {"path": "/home"})]),
    ("truncated-after-name", "", '<tool_call>{"name": "delete_files", "argu', [("delete_files", {})]),
    ("truncated-forced-choice", FORCED_DELETE, '{"path": "/ho', [("delete_files", {"path": "/ho"})]),
    ("forced-choice-one-token", FORCED_DELETE, "{", [("delete_files", {})]),
    ("two-calls", "", "Checking." + block("get_weather", {"city": "Paris"}) + block("delete_files", {"path": "/"}),
     [("get_weather", {"city": "Paris"}), ("delete_files", {"path": "/"})]),
    ("two-calls-second-cut-off", "", block("get_weather", {"city": "Oslo"}) + '<tool_call>{"name": "delete_files"',
     [("get_weather", {"city": "Oslo"}), ("delete_files", {})]),
    ("list-of-calls", "", '<tool_call>[{"name": "get_weather", "arguments": {"city": "Rome"}}, '
                          '{"name": "delete_files", "arguments": {"path": "/"}}]</tool_call>',
     [("get_weather", {"city": "Rome"}), ("delete_files", {"path": "/"})]),
    ("trailing-junk", "", '<tool_call>{"name": "delete_files", "arguments": {}} and more</tool_call>',
     [("delete_files", {})]),
    ("parameters-key", "", '<tool_call>{"name": "delete_files", "parameters": {"path": "/"}}</tool_call>',
     [("delete_files", {"path": "/"})]),
    ("string-arguments", "", '<tool_call>{"name": "delete_files", "arguments": "{\\"path\\": \\"/\\"}"}',
     [("delete_files", '{"path": "/"}')]),
    ("allowed-only", "", "Sure. " + block("get_weather", {"city": "Paris"}), [("get_weather", {"city": "Paris"})]),
    ("no-call", "", "It is sunny in Paris.", []),
    ("not-json", "", "<tool_call>rm -rf /</tool_call>", []),
]
IDS = [a[0] for a in ANSWERS]


@pytest.fixture()
def guard(tmp_path: Path) -> WorkerGuard:
    key = Ed25519PrivateKey.generate()
    (tmp_path / "policy.json").write_text(json.dumps(sign_policy_document(POLICY, key, "admin-1")))
    (tmp_path / "admin.pem").write_bytes(key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    return WorkerGuard(load_policy_set(tmp_path / "policy.json", tmp_path / "admin.pem", "acme"))


def gateway_calls(prefix: str, chunks: list[str]) -> tuple[str, list[tuple[str, object]]]:
    """What the gateway sends for an answer arriving in `chunks`: the content streamed before the
    end (the router's hold-back rule) and the tool calls of the final message."""
    shape = ChatAnswerShape(prefix=prefix, use_tools=True, tool_names=TOOLS)
    text, sent = "", 0
    for chunk in chunks:
        text += chunk
        sent = max(sent, shape.streamable(text))
    message, _ = shape.message(text, "length")
    calls = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in message.get("tool_calls", [])]
    return text[:sent], calls


def splits(text: str) -> list[list[str]]:
    """The answer whole, in one-character chunks, and cut in two at every position."""
    return [[text], list(text)] + [[text[:i], text[i:]] for i in range(1, len(text))]


@pytest.mark.parametrize(("case", "prefix", "answer", "expected"), ANSWERS, ids=IDS)
def test_the_parser_reads_each_answer(case: str, prefix: str, answer: str, expected: list) -> None:
    parsed = parse_tool_calls(prefix + answer)
    assert [(c.name, c.arguments) for c in parsed.calls] == expected
    if expected:
        assert "<tool_call>" not in parsed.content


@pytest.mark.parametrize(("case", "prefix", "answer", "expected"), ANSWERS, ids=IDS)
def test_guard_and_gateway_see_the_same_calls_however_the_answer_is_chunked(
        guard: WorkerGuard, case: str, prefix: str, answer: str, expected: list) -> None:
    decoded = [(n, json.loads(a) if isinstance(a, str) else a) for n, a in expected]
    forbidden = any(name != "get_weather" for name, _ in expected)
    if forbidden:  # the guard refuses the whole answer: nothing of it reaches the gateway
        with pytest.raises(GuardRefusal, match="delete_files"):
            guard.check_tools("key_a", prefix + answer)
    else:
        assert guard.check_tools("key_a", prefix + answer) == ""
    for chunks in splits(answer):
        streamed, calls = gateway_calls(prefix, chunks)
        assert calls == decoded, chunks
        assert "<tool_call>" not in streamed and "delete_files" not in streamed, chunks


def test_every_call_the_gateway_would_send_is_one_the_guard_checked(guard: WorkerGuard) -> None:
    # The guard checks with the gateway's own parser, so a call the gateway would repair is refused.
    text = '<tool_call>{"name":"delete_files","arguments":{"path":"/home'
    with pytest.raises(GuardRefusal):
        guard.check_tools("key_a", text)
    _, calls = gateway_calls("", [text])
    assert calls == [("delete_files", {"path": "/home"})]


def test_arguments_travel_as_openai_json_strings() -> None:
    assert GeneratedToolCall("f", {"a": 1}).arguments_json() == '{"a": 1}'
    assert GeneratedToolCall("f", '{"a": 1}').arguments_json() == '{"a": 1}'
    assert [c.arguments for c in parse_tool_calls('<tool_call>{"name": "f", "arguments": [1]}').calls] == ["[1]"]
    assert strip_tool_calls("a " + block("f", {}) + " b") == "a  b"
