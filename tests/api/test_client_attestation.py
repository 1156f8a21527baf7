"""A client verifies a live deployment before sending anything, and pins the worker's key."""

from __future__ import annotations

import json
from typing import Any as RunningStack  # the `stack` fixture's type lives in conftest.py

import pytest
from cryptography.hazmat.primitives import serialization

from attestation.appraisal import AppraisalPolicy
from attestation.client import verify_deployment
from attestation.errors import PolicyViolation
from attestation.verifier import VerifierTrust


def test_client_pins_the_worker_key_only_when_its_policy_accepts_the_simulated_tee(stack: RunningStack) -> None:
    jwks = json.loads((stack.home / "broker" / "jwks.json").read_text())
    # The client verifies the simulated report itself, with the simulated platform's public key.
    platform = serialization.load_pem_public_key((stack.home / "sim" / "platform.pub.pem").read_bytes())
    hardware = VerifierTrust(sim_platform_key=platform)  # type: ignore[arg-type]
    # The stored release policy is the tenant's signed envelope; its payload is the policy.
    doc_policy = json.loads(next((stack.home / "broker" / "policies" / "demo").glob("*.json")).read_text())["payload"]
    measurements = frozenset(doc_policy["allowed_measurements"])
    strict = AppraisalPolicy(allowed_tee=frozenset({"sim"}), allowed_measurements=measurements)
    with pytest.raises(PolicyViolation, match="simulated"):
        verify_deployment(stack.url, jwks, strict, evidence_trust=hardware, api_key=stack.api_key)
    lenient = AppraisalPolicy(allowed_tee=frozenset({"sim"}), allowed_measurements=measurements,
                              unsafe_allow_simulated_tee=True)
    (pinned,) = verify_deployment(stack.url, jwks, lenient, evidence_trust=hardware, api_key=stack.api_key)
    assert pinned.insecure and pinned.tee == "sim" and len(pinned.hpke_public_key) == 32
    assert pinned.workload.tenant == "demo" and pinned.workload.promises["prompts_logged"] is False
    with pytest.raises(PolicyViolation, match="measurement"):
        verify_deployment(stack.url, jwks, AppraisalPolicy(allowed_tee=frozenset({"sim"}),
                                                           allowed_measurements=frozenset({"00" * 48}),
                                                           unsafe_allow_simulated_tee=True),
                          evidence_trust=hardware, api_key=stack.api_key)
