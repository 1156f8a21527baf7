"""The one policy engine: Cedar (``cedarpy``), wrapped to return our ``Decision``.

Every control compiles to Cedar text; each policy carries an ``@id`` annotation (the rule name a
``Decision`` reports) and forbids carry an ``@reason``. Cedar semantics give us what we want:
default deny (no permit matched), forbid overrides permit, and *every* matching forbid is
reported, so a denial lists all failing conditions at once.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import cedarpy

from policy.decision import DEFAULT_DENY, Decision
from policy.errors import PolicyInvalid

EVALUATION_ERROR = "evaluation-error"


def cedar_str(value: str) -> str:
    """A Cedar string literal; escapes everything that is not plain printable ASCII."""
    out = ['"']
    for ch in value:
        if ch in '"\\':
            out.append("\\" + ch)
        elif " " <= ch <= "~":
            out.append(ch)
        else:
            out.append(f"\\u{{{ord(ch):x}}}")
    out.append('"')
    return "".join(out)


def cedar_uid(kind: str, ident: str) -> str:
    return f"{kind}::{cedar_str(ident)}"


def cedar_set(values: Sequence[str] | frozenset[str]) -> str:
    return "[" + ", ".join(cedar_str(v) for v in sorted(values)) + "]"


def uid(kind: str, ident: str) -> dict[str, str]:
    """The JSON form of an entity uid; ids with odd characters need no escaping this way."""
    return {"type": kind, "id": ident}


@dataclass(frozen=True)
class CedarPolicies:
    """Parsed Cedar policies plus their annotations, ready to evaluate many times."""

    text: str
    handle: Any  # cedarpy.PolicySet: parsed once, reused for every request
    ids: Mapping[str, str]  # cedar's positional policy name -> @id
    reasons: Mapping[str, str]  # positional name -> @reason (or the @id when none)
    effects: Mapping[str, str]  # positional name -> "permit" | "forbid"
    order: Mapping[str, int]  # positional name -> index in text (first-listed rule wins ties)
    kinds: Mapping[str, str]  # positional name -> @kind ("approval" marks forbids a human can lift)
    # Per action, only the policies whose scope can match it. Cedar's cost grows with the policy
    # count; a policy scoped ``action == A`` can never match another action, so leaving it out of
    # the other partitions changes no decision. Names are kept, so the maps above still apply.
    by_action: Mapping[str, Any] = field(default_factory=dict)
    other_actions: Any = None  # the partition for actions no policy names with ``==``

    def handle_for(self, action: str) -> Any:
        handle = self.by_action.get(action, self.other_actions)
        return self.handle if handle is None else handle


def compile_cedar(text: str, *, require_ids: bool = True) -> CedarPolicies:
    """Parse Cedar text; every policy needs a unique ``@id`` so decisions can name it."""
    try:
        handle = cedarpy.PolicySet.from_str(text)
        parsed = json.loads(cedarpy.policies_to_json_str(text))
    except ValueError as exc:
        raise PolicyInvalid(f"Cedar policies do not parse: {exc}") from exc
    statics: dict[str, Any] = parsed.get("staticPolicies", {})
    if parsed.get("templates"):
        raise PolicyInvalid("Cedar templates are not supported")
    ids: dict[str, str] = {}
    reasons: dict[str, str] = {}
    effects: dict[str, str] = {}
    order: dict[str, int] = {}
    kinds: dict[str, str] = {}
    seen: set[str] = set()
    for name, pol in statics.items():
        annotations = pol.get("annotations", {})
        pid = annotations.get("id")
        if require_ids and not pid:
            raise PolicyInvalid(f"Cedar policy {name} has no @id annotation")
        pid = pid or name
        if pid in seen:
            raise PolicyInvalid(f"duplicate Cedar @id {pid!r}")
        seen.add(pid)
        ids[name], effects[name] = pid, pol["effect"]
        reasons[name] = annotations.get("reason") or pid
        kinds[name] = annotations.get("kind", "")
        order[name] = int(name[len("policy"):]) if name.startswith("policy") else len(order)
    by_action, other_actions = _partition_by_action(statics)
    return CedarPolicies(text, handle, ids, reasons, effects, order, kinds, by_action, other_actions)


def _partition_by_action(statics: Mapping[str, Any]) -> tuple[dict[str, Any], Any]:
    """One parsed policy set per action named with ``==``, plus one for every other action.

    Only ``action == Action::"x"`` scopes are used to leave a policy out; ``in`` (action groups)
    and unscoped policies go into every partition, so the partitions are conservative.
    """
    def exact_action(pol: Mapping[str, Any]) -> str | None:
        scope = pol.get("action", {})
        entity = scope.get("entity", {})
        return entity.get("id") if scope.get("op") == "==" and entity.get("type") == "Action" else None

    exact = {name: exact_action(pol) for name, pol in statics.items()}

    def parse(names: list[str]) -> Any:
        doc = {"staticPolicies": {n: statics[n] for n in names}, "templates": {}, "templateLinks": []}
        return cedarpy.PolicySet.from_json_str(json.dumps(doc))

    shared = [n for n, a in exact.items() if a is None]
    actions = sorted({a for a in exact.values() if a is not None})
    by_action = {a: parse([n for n, b in exact.items() if b in (a, None)]) for a in actions}
    return by_action, parse(shared)


def authorize(policies: CedarPolicies, *, policy_id: str, version: int, principal: dict[str, str],
              action: str, resource: dict[str, str], context: Mapping[str, Any],
              entities: list[dict[str, Any]] | None = None) -> Decision:
    """Evaluate one request. Fails closed: an evaluation error never turns into an allow."""
    return evaluate(policies, policy_id=policy_id, version=version, principal=principal, action=action,
                    resource=resource, context=context, entities=entities)[0]


def evaluate(policies: CedarPolicies, *, policy_id: str, version: int, principal: dict[str, str],
             action: str, resource: dict[str, str], context: Mapping[str, Any],
             entities: list[dict[str, Any]] | None = None) -> tuple[Decision, frozenset[str]]:
    """``authorize`` plus the ``@kind`` of every forbid that decided a deny (empty otherwise)."""
    request = {"principal": principal, "action": uid("Action", action), "resource": resource,
               "context": dict(context)}
    result = cedarpy.is_authorized(request, policies.handle_for(action), entities or [])
    matched = sorted(result.diagnostics.reasons, key=lambda n: policies.order.get(n, 1 << 30))
    errors = tuple(f"{EVALUATION_ERROR}: {e}" for e in result.diagnostics.errors)
    if result.allowed:
        if errors:
            # A forbid that errored was skipped by Cedar; treat that as "might have forbidden".
            return Decision(False, policy_id, version, EVALUATION_ERROR, errors), frozenset()
        rule = policies.ids.get(matched[0], matched[0]) if matched else DEFAULT_DENY
        return Decision(True, policy_id, version, rule, ()), frozenset()
    forbids = [n for n in matched if policies.effects.get(n) == "forbid"]
    if not forbids:
        # With errors the request may not even have been evaluated; say so rather than default-deny.
        rule = EVALUATION_ERROR if errors else DEFAULT_DENY
        return Decision(False, policy_id, version, rule, ("no permit policy matched", *errors)), frozenset()
    reasons = tuple(policies.reasons.get(n, n) for n in forbids) + errors
    kinds = frozenset("error" if errors else policies.kinds.get(n, "") for n in forbids)
    return Decision(False, policy_id, version, policies.ids.get(forbids[0], forbids[0]), reasons), kinds


def validate_against_schema(text: str, schema: str) -> None:
    """Type-check Cedar text against our schema (unknown attributes, wrong types, bad actions)."""
    result = cedarpy.validate_policies(text, schema)
    if not result.validation_passed:
        raise PolicyInvalid("Cedar validation failed: " + "; ".join(e.error for e in result.errors))
