"""Release policy, issue #33: the TDX boot chain (allowed_rtmrs) and the GPUs' RIM match and OCSP
status. Allow/deny table, round trip, strict parsing."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from policy import PolicyInvalid, ReleaseFacts, ReleasePolicy, evaluate_release

M1 = "ab" * 48
R0, R1, R2, R3 = ("10" * 48, "11" * 48, "12" * 48, "13" * 48)
BASE = ReleasePolicy(
    policy_id="rel-1", version=3, tenant="acme", model="llama", allowed_tee=frozenset({"snp", "tdx"}),
    allowed_measurements=frozenset({M1}), require_gpu_cc=True, require_gpu_rim_match=True,
    require_gpu_ocsp_good=True,
    allowed_rtmrs=[{"rtmr0": R0, "rtmr1": R1, "rtmr2": R2.upper()},  # type: ignore[arg-type]
                   {"rtmr1": "ff" * 48, "rtmr2": "ef" * 48}],
)
FACTS = ReleaseFacts(tenant="acme", model="llama", model_version="v1", tee="tdx", measurement=M1, debug=False,
                     tcb={}, gpu_cc=True, insecure=False, signer=None, rtmrs=(R0, R1, R2, R3),
                     gpu_rim_matched=True, gpu_ocsp_good=True)


def test_the_pinned_boot_chain_with_good_gpus_is_allowed() -> None:
    evaluate_release(BASE, FACTS).require()
    # Only the RTMRs a set names are compared (RTMR3 is the workload's own, extended at run time).
    evaluate_release(BASE, dataclasses.replace(FACTS, rtmrs=(R0, R1, R2, "00" * 48))).require()
    # The second set: any RTMR0 and RTMR3.
    evaluate_release(BASE, dataclasses.replace(FACTS, rtmrs=("00" * 48, "ff" * 48, "ef" * 48, R3))).require()


@pytest.mark.parametrize(("change", "reason_part"), [
    ({"rtmrs": (R0, R1, "ee" * 48, R3)}, "TDX RTMRs"),  # another kernel command line
    ({"rtmrs": (R0, R1, "ef" * 48, R3)}, "TDX RTMRs"),  # set 1's kernel with set 2's command line is no set
    ({"rtmrs": ()}, "TDX RTMRs"),  # a TDX result without RTMRs
    ({"gpu_rim_matched": False}, "do not match the imported RIMs"),
    ({"gpu_ocsp_good": False}, "OCSP good"),
])
def test_each_failing_condition_denies(change: dict[str, Any], reason_part: str) -> None:
    d = evaluate_release(BASE, dataclasses.replace(FACTS, **change))
    assert not d.allowed and any(reason_part in r for r in d.reasons), d.reasons


def test_rtmrs_do_not_apply_to_snp_and_an_empty_list_allows_no_tdx() -> None:
    evaluate_release(BASE, dataclasses.replace(FACTS, tee="snp", rtmrs=())).require()
    none = dataclasses.replace(BASE, allowed_rtmrs=frozenset())
    assert not evaluate_release(none, FACTS).allowed
    assert evaluate_release(none, dataclasses.replace(FACTS, tee="snp", rtmrs=())).allowed


def test_gpu_requirements_refuse_a_worker_without_gpus() -> None:
    """The broker's facts say False for a bundle without GPU evidence (key_broker/service.py)."""
    d = evaluate_release(BASE, dataclasses.replace(FACTS, gpu_cc=False, gpu_rim_matched=False, gpu_ocsp_good=False))
    assert not d.allowed and len(d.reasons) == 3, d.reasons


def test_round_trip_and_old_policies_keep_their_bytes() -> None:
    doc = BASE.to_dict()
    # Sorted and lower-case, so the same policy always signs the same.
    assert doc["allowed_rtmrs"] == [{"rtmr1": "ff" * 48, "rtmr2": "ef" * 48}, {"rtmr0": R0, "rtmr1": R1, "rtmr2": R2}]
    assert doc["require_gpu_rim_match"] is doc["require_gpu_ocsp_good"] is True
    assert ReleasePolicy.from_dict(doc) == BASE and hash(ReleasePolicy.from_dict(doc)) == hash(BASE)
    plain = dataclasses.replace(BASE, allowed_rtmrs=None, require_gpu_rim_match=False, require_gpu_ocsp_good=False)
    assert set(plain.to_dict()) & {"allowed_rtmrs", "require_gpu_rim_match", "require_gpu_ocsp_good"} == set()


@pytest.mark.parametrize("change", [
    {"allowed_rtmrs": {"rtmr0": R0}},  # an object, not a list of them
    {"allowed_rtmrs": [{}]},  # a set that pins nothing would allow every boot chain
    {"allowed_rtmrs": [{"rtmr4": R0}]},
    {"allowed_rtmrs": [{"rtmr1": R1[:-2]}]},
    {"allowed_rtmrs": [{"rtmr1": "zz" * 48}]},
    {"allowed_rtmrs": [{"rtmr1": 7}]},
    {"allowed_rtmrs": "rtmr1"},
    {"require_gpu_rim_match": "yes"},
    {"require_gpu_ocsp_good": 1},
])
def test_bad_keys_are_refused(change: dict[str, Any]) -> None:
    with pytest.raises(PolicyInvalid):
        ReleasePolicy.from_dict({**BASE.to_dict(), **change})
