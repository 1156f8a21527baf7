"""Key-release policy: allow/deny table, from_dict/to_dict, default deny."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import pytest

from policy import Decision, PolicyDenied, PolicyInvalid, ReleaseFacts, ReleasePolicy, evaluate_release

M1 = "ab" * 48
M2 = "cd" * 48

BASE = ReleasePolicy(
    policy_id="rel-1", version=3, tenant="acme", model="llama", model_version="v2",
    allowed_tee=frozenset({"snp", "tdx"}), allowed_measurements=frozenset({M1.upper()}),
    min_tcb={"snp": 7, "microcode": 200}, require_gpu_cc=True, required_signer="acme-release",
)
FACTS = ReleaseFacts(tenant="acme", model="llama", model_version="v2", tee="snp", measurement=M1,
                     debug=False, tcb={"snp": 8, "microcode": 200}, gpu_cc=True, insecure=False,
                     signer="acme-release")


def test_allow_when_every_condition_holds() -> None:
    d = evaluate_release(BASE, FACTS)
    assert d == Decision(True, "rel-1", 3, "release.rel-1", ())
    d.require()


@pytest.mark.parametrize(
    ("change", "reason_part"),
    [
        ({"tenant": "evil"}, "tenant"),
        ({"model": "other"}, "model is not covered"),
        ({"model_version": "v1"}, "model version"),
        ({"tee": "sev"}, "TEE"),
        ({"measurement": M2}, "measurement"),
        ({"tcb": {"snp": 6, "microcode": 200}}, "below floor"),
        ({"tcb": {"snp": 8}}, "microcode below floor"),
        ({"debug": True}, "debug"),
        ({"gpu_cc": False}, "GPU"),
        ({"signer": "mallory"}, "signer"),
        ({"signer": None}, "signer"),
        ({"insecure": True}, "simulated"),
    ],
)
def test_each_failing_condition_denies(change: dict[str, Any], reason_part: str) -> None:
    d = evaluate_release(BASE, dataclasses.replace(FACTS, **change))
    assert not d.allowed and d.rule.startswith("release.rel-1.")
    assert (d.policy_id, d.policy_version) == ("rel-1", 3)
    assert any(reason_part in r for r in d.reasons), d.reasons
    with pytest.raises(PolicyDenied) as exc:
        d.require()
    assert exc.value.decision is d


def test_unknown_model_is_default_deny() -> None:
    d = evaluate_release(BASE, dataclasses.replace(FACTS, model="other"))
    assert not d.allowed and d.rule == "release.rel-1.model"


def test_all_failures_listed() -> None:
    bad = dataclasses.replace(FACTS, tee="sim", insecure=True, debug=True, gpu_cc=False, measurement=M2)
    d = evaluate_release(BASE, bad)
    assert len(d.reasons) == 5


def test_empty_policy_denies_everything() -> None:
    empty = ReleasePolicy(policy_id="p", version=1, tenant="acme", model="llama")
    d = evaluate_release(empty, FACTS)
    assert not d.allowed
    assert any("TEE" in r for r in d.reasons) and any("measurement" in r for r in d.reasons)


def test_simulated_tee_needs_unsafe_switch(caplog: pytest.LogCaptureFixture) -> None:
    sim_facts = dataclasses.replace(FACTS, tee="sim", insecure=True)
    pol = dataclasses.replace(BASE, allowed_tee=frozenset({"sim"}))
    assert not evaluate_release(pol, sim_facts).allowed
    with caplog.at_level(logging.WARNING):
        unsafe = dataclasses.replace(pol, unsafe_allow_simulated_tee=True)
        assert evaluate_release(unsafe, sim_facts).allowed
    assert "unsafe_allow_simulated_tee" in caplog.text


def test_any_model_version_when_none() -> None:
    pol = dataclasses.replace(BASE, model_version=None)
    assert evaluate_release(pol, dataclasses.replace(FACTS, model_version="v9")).allowed


def test_round_trip_and_unknown_keys() -> None:
    d = BASE.to_dict()
    assert ReleasePolicy.from_dict(d) == BASE
    assert d["allowed_measurements"] == [M1]  # normalized to lower case
    with pytest.raises(PolicyInvalid, match="unknown"):
        ReleasePolicy.from_dict({**d, "allow_debugg": True})
    with pytest.raises(PolicyInvalid, match="missing"):
        ReleasePolicy.from_dict({"policy_id": "x"})


@pytest.mark.parametrize(
    "bad",
    [
        {"version": 0}, {"version": "1"}, {"allowed_tee": ["sgx"]}, {"allowed_tee": "snp"},
        {"allowed_measurements": ["zz"]}, {"min_tcb": {"snp": -1}}, {"min_tcb": [1]},
        {"allow_debug": 1}, {"tenant": ""}, {"required_signer": 5},
    ],
)
def test_invalid_documents(bad: dict[str, Any]) -> None:
    with pytest.raises(PolicyInvalid):
        ReleasePolicy.from_dict({**BASE.to_dict(), **bad})


def test_policy_is_immutable() -> None:
    tcb = {"snp": 1}
    pol = dataclasses.replace(BASE, min_tcb=tcb)
    tcb["snp"] = 0
    assert pol.min_tcb["snp"] == 1
    with pytest.raises(dataclasses.FrozenInstanceError):
        pol.allow_debug = True  # type: ignore[misc]
    # Hashable, so the key broker can keep policies in sets or as cache keys.
    assert hash(pol) == hash(dataclasses.replace(pol)) and len({pol, dataclasses.replace(pol)}) == 1


# Issue #33: the workload identity and the platform conditions.
W1, W2 = "11" * 32, "22" * 32
STRICT = dataclasses.replace(BASE, allowed_workload_ids=frozenset({W1.upper()}),
                             acceptable_tcb_status=frozenset({"UpToDate"}))
STRICT_FACTS = dataclasses.replace(FACTS, workload_id=W1, tcb_status="UpToDate")


def test_strict_policy_allows_the_named_workload() -> None:
    evaluate_release(STRICT, STRICT_FACTS).require()


@pytest.mark.parametrize(("change", "reason_part"), [
    ({"workload_id": W2}, "workload identity"),
    ({"workload_id": ""}, "workload identity"),
    ({"tcb_status": "OutOfDate"}, "TCB status"),
    ({"tcb_status": "Unknown"}, "TCB status"),
    ({"vmpl": 1}, "VMPL above 0"),
    ({"migration_agent": True}, "migration agent"),
])
def test_strict_policy_denies(change: dict[str, Any], reason_part: str) -> None:
    d = evaluate_release(STRICT, dataclasses.replace(STRICT_FACTS, **change))
    assert not d.allowed and any(reason_part in r for r in d.reasons), d.reasons


def test_vmpl_and_migration_agent_are_refused_by_default_and_can_be_allowed() -> None:
    assert not evaluate_release(BASE, dataclasses.replace(FACTS, vmpl=2)).allowed
    assert evaluate_release(dataclasses.replace(BASE, max_vmpl=2), dataclasses.replace(FACTS, vmpl=2)).allowed
    assert not evaluate_release(BASE, dataclasses.replace(FACTS, migration_agent=True)).allowed
    allow_ma = dataclasses.replace(BASE, allow_migration_agent=True)
    assert evaluate_release(allow_ma, dataclasses.replace(FACTS, migration_agent=True)).allowed


def test_new_keys_round_trip_and_old_policies_keep_their_bytes() -> None:
    assert set(BASE.to_dict()) & {"allowed_workload_ids", "acceptable_tcb_status", "max_vmpl",
                                  "allow_migration_agent"} == set()
    assert ReleasePolicy.from_dict(STRICT.to_dict()) == STRICT
    assert STRICT.to_dict()["allowed_workload_ids"] == [W1]


@pytest.mark.parametrize("change", [{"allowed_workload_ids": ["not-hex"]}, {"max_vmpl": 4},
                                    {"allow_migration_agent": "yes"}])
def test_bad_new_keys_are_refused(change: dict[str, Any]) -> None:
    with pytest.raises(PolicyInvalid):
        ReleasePolicy.from_dict({**BASE.to_dict(), **change})
