"""Typed policy sections -> Cedar text.

Shape of every section: one scoped ``permit`` (what the section allows at all) plus one ``forbid``
per condition, each with an ``@id`` (the rule a decision reports) and an ``@reason``. Per-key
overrides get their own forbid, and the tenant-wide forbid for the same limit excludes those keys,
so an override can both tighten and loosen a limit.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

from policy.engine import cedar_set, cedar_str, cedar_uid
from policy.model import AgentPolicy, DataPolicy, Limits


class PolicySections(Protocol):
    """What compiling reads of a `policy.policyset.PolicySet` (which imports this module, so the
    set is named by its shape here, not by its class)."""

    @property
    def tenant(self) -> str: ...
    @property
    def admission(self) -> Limits | None: ...
    @property
    def key_overrides(self) -> Mapping[str, Limits]: ...
    @property
    def agents(self) -> Mapping[str, AgentPolicy]: ...
    @property
    def data(self) -> DataPolicy | None: ...
    @property
    def cedar(self) -> str: ...


def cedar_rule(rule_id: str, effect: str, scope: str, cond: str | None = None, reason: str | None = None,
               kind: str | None = None) -> str:
    notes = f"@id({cedar_str(rule_id)})"
    if reason:
        notes += f" @reason({cedar_str(reason)})"
    if kind:
        notes += f" @kind({cedar_str(kind)})"
    body = f"{effect}({scope})"
    if cond:
        body += f" when {{ {cond} }}"
    return f"{notes}\n{body};\n"


def _in_list(kind: str, names: list[str] | frozenset[str]) -> str:
    return "[" + ", ".join(cedar_uid(kind, n) for n in sorted(names)) + "]"


def compile_admission(ps: PolicySections) -> str:
    if ps.admission is None:
        return ""
    tenant = cedar_uid("Tenant", ps.tenant)
    act = 'action == Action::"infer"'
    out = [cedar_rule("admission.permit", "permit", f"principal in {tenant}, {act}, resource")]
    checks: dict[str, tuple[str, str, Callable[[Any], str]]] = {
        "allowed_models": ("models", "model is not allowed for this key",
                           lambda v: f"!({_in_list('Model', v)}.contains(resource))"),
        "max_context_tokens": ("max_context", "context too long",
                               lambda v: f"context.context_tokens > {v}"),
        "max_output_tokens": ("max_output", "max output tokens too high",
                              lambda v: f"context.max_output_tokens > {v}"),
    }
    for field_name, (short, reason, violated) in checks.items():
        base = getattr(ps.admission, field_name)
        if field_name == "allowed_models" and base is None:
            base = frozenset()  # default deny: no list means no model
        overridden = sorted(k for k, o in ps.key_overrides.items() if getattr(o, field_name) is not None)
        exclude = f" && !(principal in {_in_list('ApiKey', overridden)})" if overridden else ""
        if base is not None:
            out.append(cedar_rule(f"admission.{short}", "forbid", f"principal in {tenant}, {act}, resource",
                                  violated(base) + exclude, reason))
        for key in overridden:
            value = getattr(ps.key_overrides[key], field_name)
            scope = f"principal == {cedar_uid('ApiKey', key)}, {act}, resource"
            out.append(cedar_rule(f"admission.key.{key}.{short}", "forbid", scope, violated(value), reason))
    # Negative counts would turn a budget reservation into a refund.
    out.append(cedar_rule("admission.invalid_request", "forbid", f"principal, {act}, resource",
                          "context.context_tokens < 0 || context.max_output_tokens < 0",
                          "token counts must not be negative"))
    # The limiter (stateful) reports; the policy decides and names the rule.
    out.append(cedar_rule("admission.rate_limit", "forbid", f"principal, {act}, resource",
                          "context.rate_limited", "request rate limit exceeded"))
    out.append(cedar_rule("admission.token_budget", "forbid", f"principal, {act}, resource",
                          "context.over_budget", "token budget exhausted"))
    return "".join(out)


def compile_data(ps: PolicySections) -> str:
    if ps.data is None:
        return ""
    data = ps.data
    tenant = cedar_uid("Tenant", ps.tenant)
    out = [cedar_rule("data.permit", "permit",
                      f'principal in {tenant}, action in [Action::"submit", Action::"emit"], resource')]
    for action, pii in (("submit", data.pii_input), ("emit", data.pii_output)):
        blocked = sorted(t for t, a in pii.items() if a == "block")
        if blocked:
            side = "input" if action == "submit" else "output"
            out.append(cedar_rule(f"data.{side}.pii_block", "forbid",
                                  f'principal, action == Action::"{action}", resource',
                                  f"context.pii.containsAny({cedar_set(blocked)})",
                                  f"{side} contains blocked PII"))
    # Only the content actions carry these context fields: scoping keeps other decisions (tool
    # calls, admission) from failing evaluation on a missing attribute.
    content = 'principal, action in [Action::"submit", Action::"emit"], resource'
    for rid in sorted(data.blocked_patterns):
        out.append(cedar_rule(f"data.pattern.{rid}", "forbid", content,
                              f"context.blocked_patterns.contains({cedar_str(rid)})", f"blocked pattern {rid}"))
    for rid in sorted(data.blocked_topics):
        out.append(cedar_rule(f"data.topic.{rid}", "forbid", content,
                              f"context.blocked_topics.contains({cedar_str(rid)})", f"blocked topic {rid}"))
    return "".join(out)


def compile_agents(ps: PolicySections) -> str:
    if not ps.agents:
        return ""
    tenant = cedar_uid("Tenant", ps.tenant)
    call = 'action == Action::"call_tool"'
    out = [
        cedar_rule("agent.kill_switch", "forbid", f"principal, {call}, resource", "context.killed",
                   "agent key disabled by kill switch"),
        cedar_rule("agent.args_schema", "forbid", f"principal, {call}, resource", "!context.args_valid",
                   "tool arguments violate the tool's schema"),
        cedar_rule("agent.url_allowlist", "forbid", f"principal, {call}, resource", "!context.urls_allowed",
                   "URL argument is not on the tool's domain allowlist"),
    ]
    for key, agent in sorted(ps.agents.items()):
        who = f"principal == {cedar_uid('Agent', key)}"
        if agent.disabled:
            out.append(cedar_rule(f"agent.{key}.disabled", "forbid", f"{who}, {call}, resource", None,
                                  "agent key disabled by policy"))
        if agent.any_tool:
            out.append(cedar_rule(f"agent.{key}.any_tool", "permit", f"{who}, {call}, resource",
                                  f"principal in {tenant}"))
        elif agent.tools:
            out.append(cedar_rule(f"agent.{key}.tools", "permit", f"{who}, {call}, resource",
                                  f"principal in {tenant} && {_in_list('Tool', list(agent.tools))}.contains(resource)"))
        out.append(cedar_rule(f"agent.{key}.max_per_request", "forbid", f"{who}, {call}, resource",
                              f"context.request_calls > {agent.max_calls_per_request}",
                              "too many tool calls in this request"))
        out.append(cedar_rule(f"agent.{key}.max_per_session", "forbid", f"{who}, {call}, resource",
                              f"context.session_calls > {agent.max_calls_per_session}",
                              "too many tool calls in this session"))
        denied = sorted(n for n, t in agent.tools.items() if t.denied)
        if denied:
            out.append(cedar_rule(f"agent.{key}.denied_tools", "forbid", f"{who}, {call}, resource",
                                  f"{_in_list('Tool', denied)}.contains(resource)",
                                  "tool denied by the tenant's policy"))
        approval = sorted(n for n, t in agent.tools.items() if t.requires_approval)
        if approval:
            # @kind("approval"): a forbid a human can lift (context.approved), so the worker answers
            # requires_approval instead of deny when it is the only thing in the way.
            out.append(cedar_rule(f"agent.{key}.approval", "forbid", f"{who}, {call}, resource",
                                  f"{_in_list('Tool', approval)}.contains(resource) && !context.approved",
                                  "tool requires human approval", kind="approval"))
    return "".join(out)


def compile_policy_set(ps: PolicySections) -> str:
    """All sections plus the tenant's custom forbids. Release compiles per policy (policy.release.compile_release)."""
    return compile_admission(ps) + compile_data(ps) + compile_agents(ps) + ps.cedar
