"""The tool-use controls on a streaming answer (enclave_worker/tool_stream.py): a call leaves the
worker only once the guard has judged it; a refused call never leaves in part, whatever the chunking."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from enclave_worker.guard import GuardNote, GuardRefusal, WorkerGuard, load_policy_set
from enclave_worker.tool_stream import ToolCallRelease
from tests.enclave_worker.test_guard import write_signed

POLICY = {
    "policy_id": "acme-policy", "version": 1, "tenant": "acme",
    "agents": {"key_a": {"tools": {"get_weather": {"args_schema": {"type": "object"}},
                                   "fetch": {"url_args": ["url"], "allowed_domains": ["example.com"]},
                                   "send_email": {"requires_approval": True}},
                         "max_calls_per_request": 3, "max_calls_per_session": 1000}},
}


@pytest.fixture()
def guard(tmp_path: Path) -> WorkerGuard:
    doc, pub = write_signed(tmp_path, POLICY, Ed25519PrivateKey.generate())
    return WorkerGuard(load_policy_set(doc, pub, "acme"))


def block(name: str, args: object, close: bool = True) -> str:
    return f'<tool_call>\n{json.dumps({"name": name, "arguments": args})}' + ("\n</tool_call>" if close else "")


def run(guard: WorkerGuard, answer: str, prefix: str = "", step: int = 1) -> tuple[list[str], ToolCallRelease]:
    """The pieces released as the answer grows `step` characters at a time (the refusal propagates)."""
    release = ToolCallRelease(guard, "key_a", prefix, False, [])
    pieces = []
    for k in range(step, len(answer) + step, step):
        pieces.append(release.release(prefix + answer[:k], k >= len(answer)))
    return pieces, release


@pytest.mark.parametrize("step", [1, 3, 7])
def test_an_allowed_call_streams_its_arguments_before_the_block_closes(guard: WorkerGuard, step: int) -> None:
    answer = "Checking. " + block("get_weather", {"city": "Paris", "unit": "celsius"}) + " Done."
    pieces, release = run(guard, answer, step=step)
    assert "".join(pieces) == answer and not release.holding
    closing = answer.index("</tool_call>")
    sent = 0
    for k, piece in enumerate(pieces):  # some argument bytes left before the model closed the call
        sent += len(piece)
        if (k + 1) * step < closing and sent > answer.index('"Paris"'):
            break
    else:
        pytest.fail("the arguments were held to the end of the call")


@pytest.mark.parametrize("step", [1, 2, 5, 11])
@pytest.mark.parametrize("prefix", ["", "<tool_call>\n"])
def test_a_forbidden_call_is_refused_before_any_of_it_leaves(guard: WorkerGuard, step: int, prefix: str) -> None:
    content = "" if prefix else "Sure. "
    answer = content + (block("delete_files", {"path": "/home"}) if not prefix
                        else json.dumps({"name": "delete_files", "arguments": {"path": "/home"}}))
    release = ToolCallRelease(guard, "key_a", prefix, False, [])
    sent = ""
    with pytest.raises(GuardRefusal) as err:
        for k in range(step, len(answer) + step, step):
            sent += release.release(prefix + answer[:k], k >= len(answer))
    assert sent == content[:len(sent)] and "delete" not in sent and "<tool" not in sent
    assert err.value.action == "tool-call" and err.value.decision is not None
    if step == 1:  # refused as soon as the name is known: the arguments' first byte was the last one generated
        assert answer[:k].endswith('"arguments": {')


def test_a_call_whose_arguments_decide_is_held_whole_then_judged(guard: WorkerGuard) -> None:
    good = block("fetch", {"url": "https://example.com/a"})
    pieces, _ = run(guard, good)
    assert "".join(pieces) == good
    assert "".join(pieces[:len(good) - 1]) == ""  # nothing before the block was complete
    with pytest.raises(GuardRefusal):  # the same tool to another domain: refused, nothing left
        run(guard, block("fetch", {"url": "https://evil.test/x"}))


def test_a_call_held_for_approval_never_leaves_and_the_answer_says_so(guard: WorkerGuard) -> None:
    answer = "Drafted. " + block("send_email", {"to": "a@b.c"}) + block("get_weather", {"city": "Oslo"})
    pieces, release = run(guard, answer)
    out = "".join(pieces)
    assert "send_email" not in out and "a@b.c" not in out and "get_weather" in out
    assert release.held_for_approval and [n.outcome for n in release.notes] == ["requires_approval"]
    assert isinstance(release.notes[0], GuardNote)


def test_a_forced_call_held_for_approval_leaves_nothing(guard: WorkerGuard) -> None:
    prefix = '<tool_call>\n{"name": "send_email", "arguments": '
    pieces, release = run(guard, '{"to": "a@b.c"}}\n</tool_call>', prefix=prefix)
    assert "".join(pieces) == "" and release.held_for_approval


def test_a_block_that_turns_out_to_hold_another_call_is_refused(guard: WorkerGuard) -> None:
    """Duplicate keys: the name judged first is not the one the parser reads at the end."""
    answer = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}, "name": "delete_files"}</tool_call>'
    release = ToolCallRelease(guard, "key_a", "", False, [])
    sent = ""
    with pytest.raises(GuardRefusal):
        for k in range(1, len(answer) + 1):
            sent += release.release(answer[:k], k == len(answer))
    assert "delete_files" not in sent


def test_every_call_counts_against_the_request_cap_once(guard: WorkerGuard) -> None:
    three = "".join(block("get_weather", {"city": c}) for c in ("A", "B", "C"))
    pieces, _ = run(guard, three)
    assert "".join(pieces) == three
    with pytest.raises(GuardRefusal):
        run(guard, three + block("get_weather", {"city": "D"}))


def test_text_that_may_open_a_call_is_held(guard: WorkerGuard) -> None:
    release = ToolCallRelease(guard, "key_a", "", False, [])
    assert release.release("Hello <tool_c", False) == "Hello "
    assert release.holding
    assert release.release("Hello <tool_cat>", True) == "<tool_cat>"
