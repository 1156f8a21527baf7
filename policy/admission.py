"""Admission control at the gateway: allowed models, context/output caps, rate and token budget.

``evaluate_admission`` is pure (facts in, decision out). ``AdmissionGate`` is what the gateway
calls per request: it asks the limiter, lets the policy decide, and only then spends the token
budget, so a request the policy refuses never burns budget.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from policy.decision import DEFAULT_DENY, Decision
from policy.engine import authorize, uid
from policy.limiter import TokenBucketLimiter
from policy.policyset import PolicySet


@dataclass(frozen=True)
class AdmissionFacts:
    tenant: str
    api_key: str  # the key's id (never the secret)
    model: str
    context_tokens: int
    max_output_tokens: int
    rate_limited: bool = False  # set by the limiter (AdmissionGate does this)
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


class AdmissionGate:
    """Policy + limiter, for the gateway. One instance per gateway process (or per shared store)."""

    def __init__(self, limiter: TokenBucketLimiter | None = None) -> None:
        self.limiter = limiter or TokenBucketLimiter()

    def admit(self, policy_set: PolicySet, facts: AdmissionFacts) -> Decision:
        limits = policy_set.limits_for(facts.api_key)
        scope = f"{policy_set.tenant}/{facts.api_key}"
        rate_limited = False
        if limits.requests_per_minute is not None:
            # Attempts count against the rate whether or not they are admitted (that is the point).
            rate_limited = not self.limiter.try_acquire(
                f"rpm:{scope}", TokenBucketLimiter.per_minute(limits.requests_per_minute))
        cost = facts.context_tokens + facts.max_output_tokens  # reserve the worst case
        over_budget = False
        if limits.tokens_per_day is not None:
            budget = TokenBucketLimiter.per_day(limits.tokens_per_day)
            over_budget = self.limiter.available(f"tpd:{scope}", budget) < cost
        decision = evaluate_admission(policy_set, replace(facts, rate_limited=rate_limited,
                                                          over_budget=over_budget))
        if decision.allowed and limits.tokens_per_day is not None and not self.limiter.try_acquire(
                f"tpd:{scope}", TokenBucketLimiter.per_day(limits.tokens_per_day), cost):
            # Lost a race with a concurrent request between peek and take.
            return Decision(False, decision.policy_id, decision.policy_version, "admission.token_budget",
                            ("token budget exhausted",))
        return decision

    def settle(self, policy_set: PolicySet, facts: AdmissionFacts, used_tokens: int) -> None:
        """After the answer: give back the part of the reservation that was not used."""
        limits = policy_set.limits_for(facts.api_key)
        if limits.tokens_per_day is not None:
            reserved = max(0, facts.context_tokens) + max(0, facts.max_output_tokens)
            unused = reserved - min(max(0, used_tokens), reserved)  # never refund more than reserved
            self.limiter.refund(f"tpd:{policy_set.tenant}/{facts.api_key}",
                                TokenBucketLimiter.per_day(limits.tokens_per_day), unused)
