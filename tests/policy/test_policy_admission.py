"""Admission: allow/deny table per control, per-key overrides, limiter and gate."""

from __future__ import annotations

from typing import Any

import pytest

from policy import (
    AdmissionFacts,
    BucketSpec,
    InMemoryLimiterStore,
    PolicyInvalid,
    PolicySet,
    TokenBucketLimiter,
    evaluate_admission,
)

DOC: dict[str, Any] = {
    "policy_id": "acme-main", "version": 7, "tenant": "acme",
    "admission": {"allowed_models": ["llama", "qwen"], "max_context_tokens": 4096, "max_output_tokens": 512,
                  "requests_per_minute": 3, "tokens_per_day": 10_000},
    "key_overrides": {
        "k-big": {"max_output_tokens": 4096, "allowed_models": ["llama"]},
        "k-small": {"max_context_tokens": 100, "requests_per_minute": 1},
    },
    "cedar": '@id("custom.qwen-short") @reason("qwen only for short prompts")\n'
             'forbid(principal, action == Action::"infer", resource == Model::"qwen") '
             "when { context.context_tokens > 2000 };",
}
PS = PolicySet.from_dict(DOC)


def facts(key: str = "k1", model: str = "llama", ctx: int = 100, out: int = 100, **kw: Any) -> AdmissionFacts:
    return AdmissionFacts(tenant=kw.pop("tenant", "acme"), api_key=key, model=model, context_tokens=ctx,
                          max_output_tokens=out, **kw)


@pytest.mark.parametrize(
    ("f", "allowed", "rule"),
    [
        (facts(), True, "admission.permit"),
        (facts(model="qwen"), True, "admission.permit"),
        (facts(model="gpt-4"), False, "admission.models"),
        (facts(model='llama" || true'), False, "admission.models"),  # injection attempt is just a name
        (facts(ctx=4096), True, "admission.permit"),
        (facts(ctx=4097), False, "admission.max_context"),
        (facts(out=512), True, "admission.permit"),
        (facts(out=513), False, "admission.max_output"),
        (facts(rate_limited=True), False, "admission.rate_limit"),
        (facts(over_budget=True), False, "admission.token_budget"),
        (facts(model="qwen", ctx=3000), False, "custom.qwen-short"),
        # overrides loosen and tighten
        (facts("k-big", out=4096), True, "admission.permit"),
        (facts("k-big", out=4097), False, "admission.key.k-big.max_output"),
        (facts("k-big", model="qwen"), False, "admission.key.k-big.models"),
        (facts("k-small", ctx=101), False, "admission.key.k-small.max_context"),
        (facts("k-small", out=513), False, "admission.max_output"),  # not overridden: tenant value
        (facts(tenant="globex"), False, "default-deny"),
        (facts(ctx=-1), False, "admission.invalid_request"),
        (facts(out=-10_000), False, "admission.invalid_request"),
        (facts(ctx=2**70), False, "evaluation-error"),  # out of Cedar's range: fail closed
    ],
)
def test_admission_table(f: AdmissionFacts, allowed: bool, rule: str) -> None:
    d = evaluate_admission(PS, f)
    assert (d.allowed, d.rule) == (allowed, rule), d
    assert (d.policy_id, d.policy_version) == ("acme-main", 7)


def test_every_failing_condition_is_reported() -> None:
    d = evaluate_admission(PS, facts(model="gpt", ctx=9999, out=9999, rate_limited=True))
    assert len(d.reasons) == 4 and d.rule == "admission.models"


def test_no_admission_section_is_default_deny() -> None:
    ps = PolicySet.from_dict({"policy_id": "p", "version": 1, "tenant": "acme"})
    d = evaluate_admission(ps, facts())
    assert not d.allowed and d.rule == "default-deny"


def test_empty_model_list_allows_nothing() -> None:
    ps = PolicySet.from_dict({"policy_id": "p", "version": 1, "tenant": "acme", "admission": {}})
    assert evaluate_admission(ps, facts()).rule == "admission.models"


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_token_bucket_refills() -> None:
    clock = FakeClock()
    lim = TokenBucketLimiter(InMemoryLimiterStore(), clock)
    spec = BucketSpec(capacity=2, rate=1.0)
    assert lim.try_acquire("k", spec) and lim.try_acquire("k", spec)
    assert not lim.try_acquire("k", spec)
    clock.t += 1.0
    assert lim.try_acquire("k", spec) and not lim.try_acquire("k", spec)
    clock.t += 100
    assert lim.available("k", spec) == 2  # capped at capacity
    assert not lim.try_acquire("k", spec, cost=3)


@pytest.mark.parametrize(
    "bad",
    [{"admission": {"allowed_models": "llama"}}, {"admission": {"max_output_tokens": -1}},
     {"admission": {"requests_per_minute": 0}}, {"admission": {"max_tokens": 5}},
     {"key_overrides": {"bad key!": {}}}, {"version": 0}, {"tenant": ""}, {"extra": 1},
     {"cedar": "permit(principal, action, resource);"},
     {"cedar": '@id("x") permit(principal, action, resource);'},
     {"cedar": '@id("x") forbid(principal, action == Action::"infer", resource) when { context.nope };'},
     {"cedar": "forbid(principal, action, resource);"}, {"cedar": "forbid(principal"}],
)
def test_invalid_policy_sets(bad: dict[str, Any]) -> None:
    with pytest.raises(PolicyInvalid):
        PolicySet.from_dict({**DOC, **bad})


def test_round_trip() -> None:
    assert PolicySet.from_dict(PS.to_dict()).to_dict() == PS.to_dict()
