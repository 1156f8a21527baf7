"""In-enclave controls: signed tenant policy, data checks on prompts and answers, tool calls."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from enclave_worker.guard import GuardRefusal, WorkerGuard, build_guard, load_policy_set
from policy.documents import sign_policy_document
from policy.errors import PolicyInvalid
from policy.policyset import PolicySet

POLICY = {
    "policy_id": "acme-policy", "version": 3, "tenant": "acme",
    "data": {"pii_input": {"US_SSN": "block", "CREDIT_CARD": "redact"},
             "pii_output": {"EMAIL_ADDRESS": "redact"}, "blocked_patterns": {"codename": "(?i)nightingale"}},
    "agents": {"key_a": {"tools": {"get_weather": {"args_schema": {"type": "object",
                                                                     "required": ["city"]}},
                                   "send_email": {"requires_approval": True}},
                         "max_calls_per_request": 2, "max_calls_per_session": 100}},
}


def write_signed(tmp: Path, doc: dict, key: Ed25519PrivateKey, trusted: Ed25519PrivateKey | None = None
                 ) -> tuple[Path, Path]:
    (tmp / "policy.json").write_text(json.dumps(sign_policy_document(doc, key, "admin-1")))
    pub = (trusted or key).public_key().public_bytes(serialization.Encoding.PEM,
                                                     serialization.PublicFormat.SubjectPublicKeyInfo)
    (tmp / "admin.pub.pem").write_bytes(pub)
    return tmp / "policy.json", tmp / "admin.pub.pem"


@pytest.fixture()
def guard(tmp_path: Path) -> WorkerGuard:
    doc, pub = write_signed(tmp_path, POLICY, Ed25519PrivateKey.generate())
    return WorkerGuard(load_policy_set(doc, pub, "acme"))


def test_policy_signed_by_another_key_is_refused(tmp_path: Path) -> None:
    doc, pub = write_signed(tmp_path, POLICY, Ed25519PrivateKey.generate(), trusted=Ed25519PrivateKey.generate())
    with pytest.raises(PolicyInvalid):
        load_policy_set(doc, pub, "acme")


def test_policy_for_another_tenant_is_refused(tmp_path: Path) -> None:
    doc, pub = write_signed(tmp_path, POLICY, Ed25519PrivateKey.generate())
    with pytest.raises((PolicyInvalid, ValueError)):
        load_policy_set(doc, pub, "other-tenant")


def test_policy_edited_after_signing_is_refused(tmp_path: Path) -> None:
    doc, pub = write_signed(tmp_path, POLICY, Ed25519PrivateKey.generate())
    envelope = json.loads(doc.read_text())
    envelope["payload"]["data"]["pii_input"]["US_SSN"] = "allow"
    doc.write_text(json.dumps(envelope))
    with pytest.raises(PolicyInvalid):
        load_policy_set(doc, pub, "acme")


def test_worker_without_policy_needs_the_unsafe_switch() -> None:
    with pytest.raises(ValueError):
        build_guard(None, None, "acme", unsafe_no_policy=False)
    assert build_guard(None, None, "acme", unsafe_no_policy=True).policy_set is None


def test_prompt_controls(guard: WorkerGuard) -> None:
    assert guard.check_input("key_a", "m", ["hello"]) == ["hello"]
    assert guard.check_input("key_a", "m", ["card 4111 1111 1111 1111"]) == ["card [REDACTED:CREDIT_CARD]"]
    with pytest.raises(GuardRefusal, match="data policy") as err:
        guard.check_input("key_a", "m", ["fine", "my ssn is 123-45-6789"])
    assert "123-45" not in str(err.value)  # the refusal names the rule, never the content
    with pytest.raises(GuardRefusal):
        guard.check_input("key_a", "m", ["status of Project Nightingale"])


def test_answer_controls(guard: WorkerGuard) -> None:
    assert guard.buffers_output
    assert guard.check_output("key_a", "m", "write to a@b.com") == "write to [REDACTED:EMAIL_ADDRESS]"
    with pytest.raises(GuardRefusal):
        guard.check_output("key_a", "m", "the nightingale plan")


def call(name: str, args: dict) -> str:
    return f'<tool_call>\n{json.dumps({"name": name, "arguments": args})}\n</tool_call>'


TOOL_CASES = [
    ("allowed", "key_a", call("get_weather", {"city": "Paris"}), ""),
    ("needs-approval", "key_a", call("send_email", {"to": "x"}), "requires_approval"),
    ("not-allowlisted", "key_a", call("delete_files", {"path": "/"}), GuardRefusal),
    ("schema-violation", "key_a", call("get_weather", {"town": "Paris"}), GuardRefusal),
    ("unknown-agent", "key_b", call("get_weather", {"city": "Paris"}), GuardRefusal),
    ("too-many-calls", "key_a", call("get_weather", {"city": "a"}) * 3, GuardRefusal),
    ("no-calls", "key_a", "just text", ""),
]


@pytest.mark.parametrize(("name", "agent", "text", "expected"), TOOL_CASES, ids=[c[0] for c in TOOL_CASES])
def test_tool_calls_checked_before_the_answer_leaves(guard: WorkerGuard, name: str, agent: str, text: str,
                                                     expected: object) -> None:
    if isinstance(expected, type):
        with pytest.raises(expected):
            guard.check_tools(agent, text)
    else:
        assert guard.check_tools(agent, text) == expected


def test_kill_switch_takes_effect_at_once(guard: WorkerGuard) -> None:
    text = call("get_weather", {"city": "Paris"})
    assert guard.check_tools("key_a", text) == ""
    guard.kill_switch.kill("key_a")
    with pytest.raises(GuardRefusal):
        guard.check_tools("key_a", text)


def test_policyset_round_trip_matches_the_signed_payload() -> None:
    assert PolicySet.from_dict(POLICY).to_dict()["policy_id"] == "acme-policy"


def test_kill_switch_forwarded_by_the_gateway_refuses_tool_calls(guard: WorkerGuard) -> None:
    text = call("get_weather", {"city": "Paris"})
    with pytest.raises(GuardRefusal, match=r"agent\.kill_switch"):
        guard.check_tools("key_a", text, killed=True)
    assert guard.check_tools("key_a", text) == ""  # it narrows one request; nothing sticks
    assert guard.check_tools("key_a", "just text", killed=True) == ""  # answers without tool calls still pass


def test_without_an_admission_section_the_policy_sets_no_admission_limits(guard: WorkerGuard) -> None:
    guard.check_admission("key_a", "any-model", 10**6, 10**6)  # the gateway's limits still apply


def test_the_signed_admission_limits_are_enforced_in_the_worker(tmp_path: Path) -> None:
    admission = {"allowed_models": ["m"], "max_context_tokens": 100, "max_output_tokens": 8}
    doc, pub = write_signed(tmp_path, {**POLICY, "admission": admission}, Ed25519PrivateKey.generate())
    guard = WorkerGuard(load_policy_set(doc, pub, "acme"))
    guard.check_admission("key_a", "m", 100, 8)
    for model, context, output, rule in (("other", 1, 1, "admission.models"),
                                         ("m", 101, 1, "admission.max_context"),
                                         ("m", 1, 9, "admission.max_output")):
        with pytest.raises(GuardRefusal) as refused:
            guard.check_admission("key_a", model, context, output)
        assert refused.value.action == "admission" and refused.value.decision is not None
        assert refused.value.decision.rule == rule, refused.value.decision.rule


def test_list_form_content_is_checked_as_the_text_the_model_reads(guard: WorkerGuard) -> None:
    """OpenAI's list-form content: the controls see the text parts, not the repr of a list, and the
    model gets the checked (redacted) text."""
    parts = [{"type": "text", "text": "card 4111 1111 1111 1111"}, {"type": "text", "text": " thanks"}]
    out = guard.check_messages("key_a", "m", [{"role": "user", "content": parts}])
    assert out == [{"role": "user", "content": "card [REDACTED:CREDIT_CARD] thanks"}]
    # a blocked value split across two parts is joined before the check, as the template joins it
    split = [{"type": "text", "text": "my ssn is 123-45-"}, {"type": "text", "text": "6789"}]
    with pytest.raises(GuardRefusal):
        guard.check_messages("key_a", "m", [{"role": "user", "content": split}])


def test_earlier_tool_call_arguments_are_checked(guard: WorkerGuard) -> None:
    history = [{"role": "user", "content": "hi"},
               {"role": "assistant", "content": None, "tool_calls": [
                   {"id": "c1", "type": "function",
                    "function": {"name": "lookup", "arguments": '{"q": "Project Nightingale"}'}}]}]
    with pytest.raises(GuardRefusal):
        guard.check_messages("key_a", "m", history)


def test_policy_older_than_the_measured_floor_is_refused(tmp_path: Path) -> None:
    """The floor (--min-policy-version, in the init-data) stops an operator from rolling the
    tenant's policy back to an older signed version; the floor itself and newer pass."""
    doc, pub = write_signed(tmp_path, POLICY, Ed25519PrivateKey.generate())  # version 3
    with pytest.raises(ValueError, match="older than this worker's floor 4"):
        load_policy_set(doc, pub, "acme", min_version=4)
    assert load_policy_set(doc, pub, "acme", min_version=3).version == 3
    with pytest.raises(ValueError, match="floor"):
        build_guard(None, None, "acme", unsafe_no_policy=True, min_version=1)
