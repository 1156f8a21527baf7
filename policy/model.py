"""The typed tenant policy set: admission, data and agent controls, key release, custom Cedar.

Tenants write this as a JSON document (signed by a tenant admin, see ``documents``); it compiles
to Cedar (``compile``) and every decision is made by the Cedar engine. Everything here is frozen
and default-deny: a section that is absent permits nothing.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import jsonschema

from policy.errors import PolicyInvalid

PII_ACTIONS = frozenset({"allow", "redact", "block"})
PII_TYPES = frozenset({"CREDIT_CARD", "EMAIL_ADDRESS", "PHONE_NUMBER", "IBAN_CODE", "US_SSN", "IP_ADDRESS"})
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:@/+-]{0,127}$")  # key ids, tool, model and rule names


def _name(value: Any, what: str) -> str:
    if not isinstance(value, str) or not _NAME.match(value):
        raise PolicyInvalid(f"{what} {value!r} must match {_NAME.pattern}")
    return value


def _opt_int(d: Mapping[str, Any], key: str, minimum: int = 0) -> int | None:
    value = d.get(key)
    if value is None:
        return None
    if type(value) is not int or value < minimum:
        raise PolicyInvalid(f"{key} must be an int >= {minimum}")
    return value


def _check_keys(d: Any, allowed: set[str], what: str) -> Mapping[str, Any]:
    if not isinstance(d, Mapping):
        raise PolicyInvalid(f"{what} must be an object")
    unknown = set(d) - allowed
    if unknown:
        raise PolicyInvalid(f"unknown {what} keys: {sorted(unknown)}")
    return d


def _frozen(m: Mapping[str, Any]) -> Mapping[str, Any]:
    return MappingProxyType(dict(m))


@dataclass(frozen=True)
class Limits:
    """Admission limits. In a tenant default, ``allowed_models=None`` allows no model and a None
    number means "no limit"; in a per-key override, None means "inherit the tenant's value"."""

    allowed_models: frozenset[str] | None = None
    max_context_tokens: int | None = None
    max_output_tokens: int | None = None
    requests_per_minute: int | None = None
    tokens_per_day: int | None = None

    FIELDS = ("allowed_models", "max_context_tokens", "max_output_tokens", "requests_per_minute",
              "tokens_per_day")

    @classmethod
    def from_dict(cls, d: Any) -> Limits:
        d = _check_keys(d, set(cls.FIELDS), "limits")
        models = d.get("allowed_models")
        if models is not None:
            if isinstance(models, str) or not isinstance(models, list):
                raise PolicyInvalid("allowed_models must be a list")
            models = frozenset(_name(m, "model") for m in models)
        return cls(models, _opt_int(d, "max_context_tokens"), _opt_int(d, "max_output_tokens"),
                   _opt_int(d, "requests_per_minute", 1), _opt_int(d, "tokens_per_day"))

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {k: getattr(self, k) for k in self.FIELDS if getattr(self, k) is not None}
        if self.allowed_models is not None:
            out["allowed_models"] = sorted(self.allowed_models)
        return out


@dataclass(frozen=True)
class ToolRule:
    """What an agent may do with one tool."""

    name: str
    args_schema: Mapping[str, Any] | None = None  # JSON Schema for the arguments object
    url_args: tuple[str, ...] = ()  # argument names holding URLs, checked against allowed_domains
    allowed_domains: frozenset[str] = frozenset()  # "example.com" exact, "*.example.com" subdomains
    requires_approval: bool = False
    # Never callable, whatever else allows it: with `any_tool`, the tools a tenant keeps from its agents.
    denied: bool = False

    @classmethod
    def from_dict(cls, name: str, d: Any) -> ToolRule:
        d = _check_keys(d, {"args_schema", "url_args", "allowed_domains", "requires_approval", "denied"}, "tool")
        if type(d.get("denied", False)) is not bool:
            raise PolicyInvalid("denied must be a bool")
        schema = d.get("args_schema")
        if schema is not None and not isinstance(schema, Mapping):
            raise PolicyInvalid("args_schema must be an object")
        if schema is not None:
            try:
                jsonschema.validators.validator_for(schema).check_schema(schema)
            except jsonschema.SchemaError as exc:
                raise PolicyInvalid(f"args_schema of tool {name!r} is not a valid JSON Schema") from exc
        url_args = d.get("url_args", [])
        domains = d.get("allowed_domains", [])
        if not all(isinstance(x, str) for x in [*url_args, *domains]):
            raise PolicyInvalid("url_args and allowed_domains must be lists of strings")
        if type(d.get("requires_approval", False)) is not bool:
            raise PolicyInvalid("requires_approval must be a bool")
        return cls(_name(name, "tool"), schema, tuple(url_args),
                   frozenset(x.lower().rstrip(".") for x in domains), d.get("requires_approval", False),
                   d.get("denied", False))

    @functools.cached_property
    def validator(self) -> Any:
        """The compiled JSON Schema validator for the arguments (built once per rule), or None."""
        if self.args_schema is None:
            return None
        schema = dict(self.args_schema)
        return jsonschema.validators.validator_for(schema)(schema)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"requires_approval": self.requires_approval}
        if self.args_schema is not None:
            out["args_schema"] = dict(self.args_schema)
        if self.url_args:
            out["url_args"] = list(self.url_args)
        if self.allowed_domains:
            out["allowed_domains"] = sorted(self.allowed_domains)
        if self.denied:  # only when set, so documents signed before the field existed keep their form
            out["denied"] = True
        return out


@dataclass(frozen=True)
class AgentPolicy:
    """Tool-use controls for one agent key."""

    tools: Mapping[str, ToolRule] = field(default_factory=dict)
    max_calls_per_request: int = 0
    max_calls_per_session: int = 0
    disabled: bool = False
    # Any tool name may be called (agent frameworks name their tools freely); the named rules in
    # `tools` still check their tools' arguments, and the caps, approvals and kill switch still apply.
    # Off unless the tenant's signed policy says so: the allowlist stays the default.
    any_tool: bool = False

    @classmethod
    def from_dict(cls, d: Any) -> AgentPolicy:
        d = _check_keys(d, {"tools", "max_calls_per_request", "max_calls_per_session", "disabled", "any_tool"},
                        "agent")
        tools = _check_keys(d.get("tools", {}), set(d.get("tools", {})), "tools")
        for flag in ("disabled", "any_tool"):
            if type(d.get(flag, False)) is not bool:
                raise PolicyInvalid(f"{flag} must be a bool")
        return cls(_frozen({n: ToolRule.from_dict(n, t) for n, t in tools.items()}),
                   _opt_int(d, "max_calls_per_request") or 0, _opt_int(d, "max_calls_per_session") or 0,
                   d.get("disabled", False), d.get("any_tool", False))

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"tools": {n: t.to_dict() for n, t in sorted(self.tools.items())},
                               "max_calls_per_request": self.max_calls_per_request,
                               "max_calls_per_session": self.max_calls_per_session, "disabled": self.disabled}
        if self.any_tool:  # only when set, so documents signed before the field existed keep their form
            out["any_tool"] = True
        return out


@dataclass(frozen=True)
class DataPolicy:
    """Content controls applied in the worker. Content itself is never stored; ``retention_days``
    bounds how long decision metadata (audit, usage) about this tenant is kept."""

    retention_days: int = 0
    pii_input: Mapping[str, str] = field(default_factory=dict)  # entity type -> allow|redact|block
    pii_output: Mapping[str, str] = field(default_factory=dict)
    blocked_patterns: Mapping[str, str] = field(default_factory=dict)  # rule id -> regex
    blocked_topics: Mapping[str, frozenset[str]] = field(default_factory=dict)  # rule id -> keywords

    @classmethod
    def from_dict(cls, d: Any) -> DataPolicy:
        d = _check_keys(d, {"retention_days", "pii_input", "pii_output", "blocked_patterns",
                            "blocked_topics"}, "data")
        pii: dict[str, dict[str, str]] = {}
        for key in ("pii_input", "pii_output"):
            m = _check_keys(d.get(key, {}), set(PII_TYPES), key)
            if not all(v in PII_ACTIONS for v in m.values()):
                raise PolicyInvalid(f"{key} actions must be one of {sorted(PII_ACTIONS)}")
            pii[key] = dict(m)
        patterns = _check_keys(d.get("blocked_patterns", {}), set(d.get("blocked_patterns", {})), "patterns")
        for rid, rx in patterns.items():
            _name(rid, "pattern id")
            try:
                re.compile(rx)
            except (re.error, TypeError) as exc:
                raise PolicyInvalid(f"blocked pattern {rid!r} is not a valid regex: {exc}") from exc
        topics = _check_keys(d.get("blocked_topics", {}), set(d.get("blocked_topics", {})), "topics")
        for rid, words in topics.items():
            _name(rid, "topic id")
            if isinstance(words, str) or not all(isinstance(w, str) and w.strip() for w in words):
                raise PolicyInvalid(f"blocked topic {rid!r} must be a list of keywords")
        topic_sets = {k: frozenset(w.lower() for w in v) for k, v in topics.items()}
        return cls(_opt_int(d, "retention_days") or 0, _frozen(pii["pii_input"]),
                   _frozen(pii["pii_output"]), _frozen(patterns), _frozen(topic_sets))

    def to_dict(self) -> dict[str, Any]:
        return {"retention_days": self.retention_days, "pii_input": dict(self.pii_input),
                "pii_output": dict(self.pii_output), "blocked_patterns": dict(self.blocked_patterns),
                "blocked_topics": {k: sorted(v) for k, v in self.blocked_topics.items()}}
