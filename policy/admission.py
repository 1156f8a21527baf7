"""The signed policy set's admission rules: allowed models, context/output caps, and whether a
rate or budget limit (`rate_limited`, `over_budget`, facts the caller measured) is over.

``evaluate_admission`` is pure (facts in, decision out). The worker calls it on every request
(enclave_worker/guard.py `check_admission`, with the prompt's token count and max_tokens), where
the signed policy set is verified; the gateway's rate limits, budgets and queue
(api/gateway/admission.py) measure what only it can see. See docs/policy.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from policy.decision import DEFAULT_DENY, Decision
from policy.engine import authorize, uid
from policy.policyset import PolicySet


@dataclass(frozen=True)
class AdmissionFacts:
    tenant: str
    api_key: str  # the key's id (never the secret)
    model: str
    context_tokens: int
    max_output_tokens: int
    rate_limited: bool = False  # measured by the caller's limiter
    over_budget: bool = False


def evaluate_admission(policy_set: PolicySet, facts: AdmissionFacts) -> Decision:
    """Decide one request against the tenant's policy set (default deny)."""
    if facts.tenant != policy_set.tenant:
        # A policy set only ever speaks for its own tenant.
        return Decision(False, policy_set.policy_id, policy_set.version, DEFAULT_DENY,
                        ("policy set belongs to another tenant",))
    context: dict[str, Any] = {
        "model": facts.model, "context_tokens": facts.context_tokens,
        "max_output_tokens": facts.max_output_tokens, "rate_limited": facts.rate_limited,
        "over_budget": facts.over_budget,
    }
    entities = [{"uid": uid("ApiKey", facts.api_key), "attrs": {}, "parents": [uid("Tenant", facts.tenant)]}]
    return authorize(policy_set.compiled, policy_id=policy_set.policy_id, version=policy_set.version,
                     principal=uid("ApiKey", facts.api_key), action="infer",
                     resource=uid("Model", facts.model), context=context, entities=entities)
