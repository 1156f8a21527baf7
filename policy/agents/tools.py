"""Tool-call checks the worker runs before an answer (with tool calls) leaves the trust boundary.

Facts come from Python (argument schema, URL allowlist, call counts, kill switch); the decision
comes from Cedar (action ``call_tool``). Forbids annotated ``@kind("approval")`` are lifted by a
human approval (``context.approved``): when they are the only thing in the way, the verdict is
``requires_approval`` rather than ``deny``. Tenants can add such rules in custom Cedar too.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from policy.agents.urls import UrlRejected, check_url
from policy.decision import Decision
from policy.engine import evaluate, uid
from policy.model import ToolRule
from policy.policyset import PolicySet

ALLOW, DENY, REQUIRES_APPROVAL = "allow", "deny", "requires_approval"


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: Mapping[str, Any] | str  # OpenAI sends a JSON string; parsed here, never trusted
    approved: bool = False  # set by the worker only after a human approved this exact call


@dataclass(frozen=True)
class ToolCallVerdict:
    call: ToolCall
    outcome: str  # "allow" | "deny" | "requires_approval" (not executed until a human approves)
    decision: Decision
    details: tuple[str, ...] = ()  # validator findings (field paths, rejected host), no argument values


@dataclass(frozen=True)
class ToolCallVerdicts:
    verdicts: tuple[ToolCallVerdict, ...]

    @property
    def all_allowed(self) -> bool:
        return all(v.outcome == ALLOW for v in self.verdicts)

    def by_outcome(self, outcome: str) -> list[ToolCallVerdict]:
        return [v for v in self.verdicts if v.outcome == outcome]


class SessionState:
    """Per agent session: tool calls counted so far. Thread-safe; lives as long as the session."""

    def __init__(self, session_id: str, calls: int = 0) -> None:
        self.session_id = session_id
        self._calls = calls
        self._lock = threading.Lock()

    @property
    def calls(self) -> int:
        with self._lock:
            return self._calls

    def reserve(self, n: int) -> int:
        """Count ``n`` more calls; returns the count before them (atomic across threads)."""
        with self._lock:
            before = self._calls
            self._calls += n
            return before


class KillSwitch:
    """Agent keys switched off at runtime. A flip is visible to the very next check (no caching),
    without publishing a new policy version."""

    def __init__(self) -> None:
        self._killed: set[str] = set()
        self._lock = threading.Lock()

    def kill(self, agent_key: str) -> None:
        with self._lock:
            self._killed.add(agent_key)

    def revive(self, agent_key: str) -> None:
        with self._lock:
            self._killed.discard(agent_key)

    def is_killed(self, agent_key: str) -> bool:
        with self._lock:
            return agent_key in self._killed


def refusal_message(name: str, rule: str) -> str:
    """What a refused tool call says: the rule that decided, and how the tenant changes it (the tools
    an agent key may call are in the tenant's signed policy, which only the tenant can sign)."""
    return (f"tool call {name[:64]!r} refused by agent policy (rule {rule}); the tools each API key may call "
            "are set in the tenant's signed policy (agents.<key id>.tools, or any_tool): the tenant edits it, "
            "signs it with `sealed policies sign` and stores it with `sealed policies set`")


def _check_args(rule: ToolRule | None, arguments: Mapping[str, Any] | str) -> tuple[bool, bool, list[str]]:
    """(args_valid, urls_allowed, details). Unknown tools pass here; the policy denies them."""
    if rule is None:
        return True, True, []
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return False, True, ["arguments are not valid JSON"]
    if not isinstance(arguments, Mapping):
        return False, True, ["arguments must be a JSON object"]
    details: list[str] = []
    args_valid = True
    if rule.validator is not None:
        for err in rule.validator.iter_errors(dict(arguments)):
            args_valid = False
            details.append(f"schema: {'/'.join(map(str, err.absolute_path)) or '<root>'}: {err.validator}")
    urls_allowed = True
    for name in rule.url_args:
        if name not in arguments:
            continue
        try:
            check_url(arguments[name], rule.allowed_domains)
        except UrlRejected as exc:
            urls_allowed = False
            details.append(f"url {name}: {exc}")
    return args_valid, urls_allowed, details


def check_tool_calls(policy_set: PolicySet, agent_key: str, session_state: SessionState,
                     tool_calls: Sequence[ToolCall], *,
                     kill_switch: KillSwitch | None = None, killed: bool = False) -> ToolCallVerdicts:
    """One verdict per call, in order. Every call counts against the request and session caps,
    denied ones included, so a looping agent cannot probe forever."""
    before = session_state.reserve(len(tool_calls))
    killed = killed or (kill_switch.is_killed(agent_key) if kill_switch is not None else False)
    return ToolCallVerdicts(tuple(
        check_tool_call(policy_set, agent_key, call, request_calls=index + 1, session_calls=before + index + 1,
                        killed=killed) for index, call in enumerate(tool_calls)))


def args_decide(policy_set: PolicySet, agent_key: str, name: str) -> bool:
    """Whether a call to `name` may be decided differently depending on its arguments (an argument
    schema beyond "an object", URL arguments): such a call is judged only once it is complete. A tool
    outside the allowlist is decided by its name alone (its arguments are not checked)."""
    agent = policy_set.agents.get(agent_key)
    rule = agent.tools.get(name) if agent else None
    if rule is None:
        return False
    return bool(rule.url_args) or dict(rule.args_schema or {}) not in ({}, {"type": "object"})


def check_tool_call(policy_set: PolicySet, agent_key: str, call: ToolCall, *, request_calls: int,
                    session_calls: int, killed: bool) -> ToolCallVerdict:
    """The verdict on one call, the `request_calls`-th of its request and `session_calls`-th of its
    session (the caller has counted it: SessionState.reserve)."""
    agent = policy_set.agents.get(agent_key)
    entities = [{"uid": uid("Agent", agent_key), "attrs": {}, "parents": [uid("Tenant", policy_set.tenant)]}]
    rule = agent.tools.get(call.name) if agent else None
    args_valid, urls_allowed, details = _check_args(rule, call.arguments)
    context = {"killed": killed, "args_valid": args_valid, "urls_allowed": urls_allowed,
               "request_calls": request_calls, "session_calls": session_calls, "approved": call.approved}
    common: dict[str, Any] = {"policy_id": policy_set.policy_id, "version": policy_set.version,
                              "principal": uid("Agent", agent_key), "action": "call_tool",
                              "resource": uid("Tool", call.name), "entities": entities}
    decision, kinds = evaluate(policy_set.compiled, context=context, **common)
    outcome = ALLOW if decision.allowed else DENY
    if kinds == {"approval"}:
        # Only approval rules said no: would the call pass once approved? (A permit must match.)
        lifted, _ = evaluate(policy_set.compiled, context={**context, "approved": True}, **common)
        outcome = REQUIRES_APPROVAL if lifted.allowed else DENY
        decision = decision if lifted.allowed else lifted
    return ToolCallVerdict(call, outcome, decision, tuple(details))
