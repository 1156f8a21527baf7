"""Agent controls: adversarial URLs, tool allowlist, argument schema, caps, approval, kill switch."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest

from policy import PolicySet
from policy.agents import KillSwitch, SessionState, ToolCall, UrlRejected, check_tool_calls, check_url

DOMAINS = frozenset({"example.com", "*.docs.example.org", "bücher.de"})


@pytest.mark.parametrize(
    "url",
    [
        "https://example.com/",
        "https://example.com",
        "https://EXAMPLE.com/path?q=1#frag",
        "https://example.com./x",  # one trailing dot is the same host
        "https://example.com:443/x",
        "https://api.docs.example.org/v1",
        "https://a.b.docs.example.org/",
        "https://xn--bcher-kva.de/",
        "https://BÜCHER.de/",
        "https://example.com/a/b..c/d",  # '..' inside a name, not a segment
        "https://example.com#@evil.com",  # WHATWG and urllib agree: '@evil.com' is the fragment
    ],
)
def test_url_allowed(url: str) -> None:
    check_url(url, DOMAINS)


@pytest.mark.parametrize(
    "url",
    [
        "http://example.com/",  # scheme
        "ftp://example.com/", "file:///etc/passwd", "javascript:alert(1)", "//example.com/",
        "https://evil.com@example.com/", "https://example.com@evil.com/",  # userinfo tricks
        "https://user:pw@example.com/", "https://example.com%40evil.com/",
        "https://evil.com/example.com", "https://example.com.evil.com/", "https://evilexample.com/",
        "https://docs.example.org/",  # wildcard means strict subdomains
        "https://example.com:8443/", "https://example.com:0/", "https://example.com:99999/",  # ports
        "https://127.0.0.1/", "https://[::1]/", "https://2130706433/", "https://0x7f.0.0.1/",
        "https://0177.0.0.1/", "https://[::ffff:127.0.0.1]/",  # IP literals in many notations
        "https://exаmple.com/",  # Cyrillic 'а' homograph
        "https://xn--exmple-cua.com/", "https://example.com../", "https://.example.com/",
        "https://example..com/", "https://example.com/../admin", "https://example.com/a/%2e%2e/b",
        "https://example.com/a/%252e%252e/b", "https://example.com\\@evil.com/",
        "https://example.com /", "https://exa\tmple.com/", "https://example.com\n.evil.com/",
        "", "https://", "https://-example.com/", "x" * 3000,
    ],
)
def test_url_rejected(url: str) -> None:
    with pytest.raises(UrlRejected):
        check_url(url, DOMAINS)


def test_non_string_url_rejected() -> None:
    with pytest.raises(UrlRejected):
        check_url(123, DOMAINS)  # type: ignore[arg-type]


FETCH_SCHEMA = {"type": "object", "properties": {"url": {"type": "string", "maxLength": 2048}},
                "required": ["url"], "additionalProperties": False}
SQL_SCHEMA = {"type": "object", "properties": {"table": {"enum": ["orders", "items"]},
                                               "limit": {"type": "integer", "minimum": 1, "maximum": 100}},
              "required": ["table"], "additionalProperties": False}
DOC: dict[str, Any] = {
    "policy_id": "acme-agents", "version": 2, "tenant": "acme",
    "agents": {
        "agent-1": {"max_calls_per_request": 3, "max_calls_per_session": 5, "tools": {
            "fetch": {"args_schema": FETCH_SCHEMA, "url_args": ["url"], "allowed_domains": ["example.com"]},
            "query": {"args_schema": SQL_SCHEMA},
            "send_email": {"requires_approval": True},
        }},
        "agent-off": {"disabled": True, "max_calls_per_request": 3, "max_calls_per_session": 5,
                      "tools": {"fetch": {}}},
    },
}
PS = PolicySet.from_dict(DOC)


def one(call: ToolCall, agent: str = "agent-1", session: SessionState | None = None,
        kill: KillSwitch | None = None) -> tuple[str, str]:
    v = check_tool_calls(PS, agent, session or SessionState("s"), [call], kill_switch=kill).verdicts[0]
    return v.outcome, v.decision.rule


@pytest.mark.parametrize(
    ("call", "outcome", "rule"),
    [
        (ToolCall("fetch", {"url": "https://example.com/x"}), "allow", "agent.agent-1.tools"),
        (ToolCall("fetch", json.dumps({"url": "https://example.com/x"})), "allow", "agent.agent-1.tools"),
        (ToolCall("fetch", {"url": "https://evil.com"}), "deny", "agent.url_allowlist"),
        (ToolCall("fetch", {"url": "https://example.com@evil.com"}), "deny", "agent.url_allowlist"),
        (ToolCall("fetch", {"url": "https://169.254.169.254/latest"}), "deny", "agent.url_allowlist"),
        (ToolCall("fetch", {"url": ["https://example.com"]}), "deny", "agent.args_schema"),
        (ToolCall("fetch", {"url": "https://example.com", "proxy": "x"}), "deny", "agent.args_schema"),
        (ToolCall("fetch", {}), "deny", "agent.args_schema"),
        (ToolCall("fetch", "{not json"), "deny", "agent.args_schema"),
        (ToolCall("fetch", "[1, 2]"), "deny", "agent.args_schema"),
        (ToolCall("query", {"table": "orders", "limit": 10}), "allow", "agent.agent-1.tools"),
        (ToolCall("query", {"table": "users; DROP TABLE orders"}), "deny", "agent.args_schema"),
        (ToolCall("query", {"table": "orders", "limit": 10**9}), "deny", "agent.args_schema"),
        (ToolCall("query", {"table": "orders", "limit": "10"}), "deny", "agent.args_schema"),
        (ToolCall("send_email", {"to": "a@b.c"}), "requires_approval", "agent.agent-1.approval"),
        (ToolCall("shell", {"cmd": "rm -rf /"}), "deny", "default-deny"),
        (ToolCall('fetch" || true', {}), "deny", "default-deny"),
    ],
)
def test_tool_call_table(call: ToolCall, outcome: str, rule: str) -> None:
    assert one(call) == (outcome, rule)


def test_unknown_agent_and_disabled_agent() -> None:
    assert one(ToolCall("fetch", {"url": "https://example.com"}), agent="nobody") == ("deny", "default-deny")
    assert one(ToolCall("fetch", {}), agent="agent-off") == ("deny", "agent.agent-off.disabled")


def test_kill_switch_takes_effect_at_once() -> None:
    kill = KillSwitch()
    call = ToolCall("query", {"table": "orders"})
    assert one(call, kill=kill)[0] == "allow"
    kill.kill("agent-1")
    assert one(call, kill=kill) == ("deny", "agent.kill_switch")
    assert one(call, agent="agent-1", kill=kill)[0] == "deny"
    kill.revive("agent-1")
    assert one(call, kill=kill)[0] == "allow"


def test_caps_per_request_and_session() -> None:
    session = SessionState("s1")
    calls = [ToolCall("query", {"table": "orders"})] * 4
    v = check_tool_calls(PS, "agent-1", session, calls)
    assert [x.outcome for x in v.verdicts] == ["allow"] * 3 + ["deny"]
    assert v.verdicts[3].decision.rule == "agent.agent-1.max_per_request"
    v = check_tool_calls(PS, "agent-1", session, calls[:2])  # session already at 4 of 5
    assert [x.outcome for x in v.verdicts] == ["allow", "deny"]
    assert v.verdicts[1].decision.rule == "agent.agent-1.max_per_session"
    assert not v.all_allowed and len(v.by_outcome("deny")) == 1


def test_session_count_is_atomic() -> None:
    session = SessionState("s")
    threads = [threading.Thread(target=lambda: [session.reserve(1) for _ in range(500)]) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert session.calls == 2000


def test_details_name_fields_not_values() -> None:
    secret = "https://evil.com/?token=SECRET123"
    v = check_tool_calls(PS, "agent-1", SessionState("s"), [ToolCall("fetch", {"url": secret})]).verdicts[0]
    assert v.details and all("SECRET123" not in d for d in v.details)


def test_invalid_tool_schema_rejected_at_upload() -> None:
    from policy import PolicyInvalid

    bad = json.loads(json.dumps(DOC))
    bad["agents"]["agent-1"]["tools"]["query"]["args_schema"] = {"type": "no-such-type"}
    with pytest.raises(PolicyInvalid):
        PolicySet.from_dict(bad)


def test_approval_flow() -> None:
    email = ToolCall("send_email", {"to": "a@b.c"})
    assert one(email) == ("requires_approval", "agent.agent-1.approval")
    assert one(ToolCall("send_email", {"to": "a@b.c"}, approved=True)) == ("allow", "agent.agent-1.tools")
    kill = KillSwitch()
    kill.kill("agent-1")
    # Approval never overrides a real deny.
    assert one(email, kill=kill) == ("deny", "agent.kill_switch")


def test_custom_approval_rule_and_no_permit() -> None:
    doc = json.loads(json.dumps(DOC))
    doc["cedar"] = ('@id("custom.big-queries") @kind("approval") @reason("large query needs approval")\n'
                    'forbid(principal, action == Action::"call_tool", resource) '
                    "when { context.request_calls > 1 && !context.approved };")
    ps = PolicySet.from_dict(doc)
    v = check_tool_calls(ps, "agent-1", SessionState("s"),
                         [ToolCall("query", {"table": "orders"}), ToolCall("query", {"table": "items"}),
                          ToolCall("shell", {})]).verdicts
    assert [x.outcome for x in v] == ["allow", "requires_approval", "deny"]
    assert v[1].decision.rule == "custom.big-queries"
    assert v[2].decision.rule == "default-deny"  # approval cannot lift a missing permit


def test_data_rules_do_not_break_tool_decisions() -> None:
    """Content-only context fields (blocked patterns/topics) must not make tool decisions fail."""
    doc = {**DOC, "data": {"blocked_patterns": {"codename": "(?i)nightingale"},
                           "blocked_topics": {"weapons": ["nerve agent"]}}}
    verdict = check_tool_calls(PolicySet.from_dict(doc), "agent-1", SessionState("s"),
                               [ToolCall("query", {"table": "orders"})]).verdicts[0]
    assert verdict.outcome == "allow", verdict.decision.reasons


ANY: dict[str, Any] = {
    "policy_id": "acme-any", "version": 1, "tenant": "acme",
    "agents": {"agent-any": {"any_tool": True, "max_calls_per_request": 2, "max_calls_per_session": 3,
                             "tools": {"fetch": {"args_schema": FETCH_SCHEMA, "url_args": ["url"],
                                                 "allowed_domains": ["example.com"]},
                                       "send_email": {"requires_approval": True},
                                       "delete_files": {"denied": True}}},
               "agent-list": {"max_calls_per_request": 2, "max_calls_per_session": 3, "tools": {"fetch": {}}}},
}
PS_ANY = PolicySet.from_dict(ANY)


def any_one(call: ToolCall, agent: str = "agent-any", session: SessionState | None = None,
            kill: KillSwitch | None = None) -> tuple[str, str]:
    v = check_tool_calls(PS_ANY, agent, session or SessionState("s"), [call], kill_switch=kill).verdicts[0]
    return v.outcome, v.decision.rule


@pytest.mark.parametrize(
    ("call", "agent", "outcome", "rule"),
    [
        (ToolCall("City", {"name": "Paris"}), "agent-any", "allow", "agent.agent-any.any_tool"),
        (ToolCall("transfer_to_billing_agent", {}), "agent-any", "allow", "agent.agent-any.any_tool"),
        # A named rule still checks its own tool's arguments under any_tool.
        (ToolCall("fetch", {"url": "https://evil.com"}), "agent-any", "deny", "agent.url_allowlist"),
        (ToolCall("fetch", {"url": "https://example.com/"}), "agent-any", "allow", "agent.agent-any.any_tool"),
        (ToolCall("send_email", {"to": "a@b.c"}), "agent-any", "requires_approval", "agent.agent-any.approval"),
        # A tool the tenant denies stays denied, whatever any_tool allows.
        (ToolCall("delete_files", {"path": "/"}), "agent-any", "deny", "agent.agent-any.denied_tools"),
        # Without any_tool, the allowlist decides: another key, another tenant's key, no key.
        (ToolCall("City", {"name": "Paris"}), "agent-list", "deny", "default-deny"),
        (ToolCall("City", {"name": "Paris"}), "nobody", "deny", "default-deny"),
    ],
)
def test_any_tool_permits_every_name_and_keeps_the_other_rules(call: ToolCall, agent: str, outcome: str,
                                                               rule: str) -> None:
    assert any_one(call, agent) == (outcome, rule)


def test_any_tool_keeps_the_caps_and_the_kill_switch() -> None:
    session = SessionState("s")
    verdicts = check_tool_calls(PS_ANY, "agent-any", session, [ToolCall(f"t{i}", {}) for i in range(3)]).verdicts
    assert [v.outcome for v in verdicts] == ["allow", "allow", "deny"]
    assert verdicts[2].decision.rule == "agent.agent-any.max_per_request"
    kill = KillSwitch()
    kill.kill("agent-any")
    assert any_one(ToolCall("City", {}), kill=kill) == ("deny", "agent.kill_switch")


@pytest.mark.parametrize("value", ["yes", 1, None, []])
def test_any_tool_and_denied_must_be_bools(value: object) -> None:
    from policy.errors import PolicyInvalid

    doc = {**ANY, "agents": {"a": {"any_tool": value, "max_calls_per_request": 1, "max_calls_per_session": 1}}}
    with pytest.raises(PolicyInvalid, match="any_tool"):
        PolicySet.from_dict(doc)
    doc = {**ANY, "agents": {"a": {"tools": {"t": {"denied": value}}, "max_calls_per_request": 1,
                                   "max_calls_per_session": 1}}}
    with pytest.raises(PolicyInvalid, match="denied"):
        PolicySet.from_dict(doc)


def test_any_tool_round_trips_and_is_absent_from_documents_that_do_not_set_it() -> None:
    assert PolicySet.from_dict(PS_ANY.to_dict()).agents["agent-any"].any_tool is True
    assert "any_tool" not in PS.to_dict()["agents"]["agent-1"]  # earlier signed documents keep their form
    assert "denied" not in PS.to_dict()["agents"]["agent-1"]["tools"]["fetch"]
    assert PolicySet.from_dict(PS_ANY.to_dict()).agents["agent-any"].tools["delete_files"].denied is True


def test_a_refusal_names_the_rule_and_the_commands_that_change_it() -> None:
    from policy.agents import refusal_message

    text = refusal_message("shell", "default-deny")
    assert "'shell'" in text and "rule default-deny" in text
    assert "sealed policies sign" in text and "sealed policies set" in text
