"""Release policy `gpu_count`: the node must attest exactly that many GPUs. Each GPU's evidence
verifies on its own, so NVIDIA's real 8-GPU PPCIE evidence with one GPU left out still verifies;
only a policy that names the count refuses it (the broker's facts count the verified GPUs,
key_broker/service.py)."""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import json
from pathlib import Path
from typing import Any

import pytest

from attestation.nvgpu import verify_gpu_list
from attestation.x509chain import load_pem_chain
from policy import PolicyInvalid, ReleaseFacts, ReleasePolicy, evaluate_release

M1 = "ab" * 48
PPCIE_AT = dt.datetime(2025, 10, 1, tzinfo=dt.UTC)
POLICY = ReleasePolicy(policy_id="rel-1", version=1, tenant="acme", model="llama", allowed_tee=frozenset({"snp"}),
                       allowed_measurements=frozenset({M1}), require_gpu_cc=True, gpu_count=8)


def _facts(gpus: int) -> ReleaseFacts:
    return ReleaseFacts(tenant="acme", model="llama", model_version="v1", tee="snp", measurement=M1, debug=False,
                        tcb={}, gpu_cc=gpus > 0, insecure=False, signer=None, gpu_count=gpus)


def _verified_gpus(tv: Path, drop: int | None = None) -> int:
    """How many GPUs of NVIDIA's 8-GPU evidence document verify (one left out with `drop`)."""
    entries = json.loads((tv / "nvgpu" / "nvtrust_ppcie_gpu_evidence_8gpu.json").read_text())
    items = [(base64.b64decode(e["evidence"]), load_pem_chain(base64.b64decode(e["certificate"])))
             for i, e in enumerate(entries) if i != drop]
    return len(verify_gpu_list(items, nonce=bytes.fromhex(entries[0]["nonce"]), now=PPCIE_AT))


def test_all_eight_gpus_are_released_to(testvectors: Path) -> None:
    evaluate_release(POLICY, _facts(_verified_gpus(testvectors))).require()


@pytest.mark.parametrize("drop", [0, 7])
def test_a_document_with_one_gpu_left_out_verifies_but_is_refused(testvectors: Path, drop: int) -> None:
    count = _verified_gpus(testvectors, drop)
    assert count == 7  # the evidence itself verifies
    decision = evaluate_release(POLICY, _facts(count))
    assert not decision.allowed and decision.reasons == ("the node must attest exactly 8 GPU(s)",)


def test_more_gpus_than_named_and_none_are_refused() -> None:
    assert not evaluate_release(POLICY, _facts(9)).allowed
    assert not evaluate_release(dataclasses.replace(POLICY, require_gpu_cc=False), _facts(0)).allowed


def test_a_policy_that_names_no_count_keeps_todays_behaviour(testvectors: Path) -> None:
    unnamed = dataclasses.replace(POLICY, gpu_count=None)
    evaluate_release(unnamed, _facts(_verified_gpus(testvectors, drop=3))).require()
    assert "gpu_count" not in unnamed.to_dict()  # earlier policies keep their bytes (and signatures)


def test_round_trip() -> None:
    doc = POLICY.to_dict()
    assert doc["gpu_count"] == 8 and ReleasePolicy.from_dict(doc) == POLICY


@pytest.mark.parametrize("value", [0, -1, "8", 8.0, True])
def test_a_bad_count_is_refused(value: Any) -> None:
    with pytest.raises(PolicyInvalid, match="gpu_count"):
        ReleasePolicy.from_dict({**POLICY.to_dict(), "gpu_count": value})
