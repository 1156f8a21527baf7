"""A client can verify a worker at any time in its life: the worker renews its broker token (fresh
evidence, same keys) at half its remaining lifetime. Injected clock: one hour and one day after boot."""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from attestation.appraisal import AppraisalPolicy
from attestation.bundle import EvidenceBundle, channel_binding
from attestation.errors import TokenError
from attestation.token import TokenVerifier
from attestation.workload import WorkloadClaims
from enclave_worker.freshness import renew_in
from protocol.broker.client import obtain_data_key, renew_attestation
from protocol.model_ref import ModelRef
from protocol.sealed import WorkerKey
from sealed_client.deployment import ClientTrust, verify_sealed_document

MEASUREMENT = bytes(range(48))


def _doc(token: str, bundle: EvidenceBundle, serving: WorkerKey, usage_public: bytes) -> dict[str, Any]:
    return {"model": "m", "version": "v1", "tenant": "acme", "token": token, "evidence": bundle.to_json(),
            "sealed_key_id": serving.key_id, "usage_public_key": usage_public.hex(), "grpc_tls_cert": None,
            "promises": {}}


@pytest.mark.parametrize("horizon_s", [3600, 86400], ids=["one hour", "one day"])
def test_client_verifies_the_worker_long_after_boot(kb: Any, clock: Any, horizon_s: int) -> None:
    kb.setup_tenant("acme")
    serving, usage = WorkerKey.generate(), Ed25519PrivateKey.generate()
    usage_public = usage.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    binding = channel_binding(b"", usage_public)
    # The worker binds what it serves into every bundle (enclave_worker.tee.workload_claims).
    workload = WorkloadClaims("acme", "m", "v1", "d").encode()

    def make_bundle(runtime: Any) -> EvidenceBundle:
        return kb.bundle(dataclasses.replace(runtime, workload=workload))

    released = obtain_data_key(kb.client, ModelRef("acme", "m", "v1"), make_bundle=make_bundle,
                               channel_binding=binding, hpke_key=serving.private_key)
    appraisal = AppraisalPolicy(allowed_tee=frozenset({"sim"}), allowed_measurements=frozenset({MEASUREMENT.hex()}),
                                unsafe_allow_simulated_tee=True)
    platform = kb.platform.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    trust = ClientTrust(appraisal, tenant="acme", unsafe_no_tenant_key=True,
                        broker_jwks=kb.client.get("/.well-known/jwks.json").json(),
                        sim_platform_key=platform)
    verifier = TokenVerifier(trust.broker_jwks, trust.broker_issuer)  # type: ignore[arg-type]
    boot = clock.now
    pin = verify_sealed_document(_doc(released.token, released.bundle, serving, usage_public), verifier, trust, boot)
    assert pin.worker_key_id == serving.key_id

    # Without renewal the document served at boot is refused later (the test can fail).
    with pytest.raises(TokenError):
        verify_sealed_document(_doc(released.token, released.bundle, serving, usage_public), verifier, trust,
                               boot + dt.timedelta(seconds=horizon_s))

    # The worker's schedule (enclave_worker.freshness): renew at half the remaining lifetime.
    token, bundle, target, renewals = released.token, released.bundle, boot + dt.timedelta(seconds=horizon_s), 0
    while True:
        wait = renew_in(token, clock.now.timestamp())
        if clock.now + dt.timedelta(seconds=wait) > target:
            break
        clock.advance(wait)
        token, bundle = renew_attestation(kb.client, ModelRef("acme", "m", "v1"), make_bundle=make_bundle,
                                          hpke_public_key=serving.public_bytes, channel_binding=binding)
        renewals += 1
    clock.now = target
    pin = verify_sealed_document(_doc(token, bundle, serving, usage_public), verifier, trust, target)
    assert pin.worker_key_id == serving.key_id and pin.token_expires_at > target.timestamp()
    assert renewals >= horizon_s // 300  # at least one renewal per token lifetime


def test_renewal_schedule_is_half_the_remaining_life() -> None:
    import jwt

    token = jwt.encode({"exp": 1300}, "k" * 32, algorithm="HS256")
    assert renew_in(token, 1000) == 150
    assert renew_in(token, 1299) == 5.0  # never a busy loop
