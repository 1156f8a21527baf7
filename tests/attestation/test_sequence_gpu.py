"""CPU + GPU evidence in one bundle: the GPU answers the same nonce, its evidence is bound into the
CPU REPORT_DATA, and the verifier checks both (GPU under a generated test device-identity root)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from attestation.appraisal import AppraisalPolicy, appraise
from attestation.bundle import EvidenceBundle, GpuEvidence, RuntimeData, expected_report_data
from attestation.errors import AttestationError, FreshnessError
from attestation.sim import SimTee
from attestation.verifier import VerifierTrust, verify_bundle
from sealed_fakes import nvgpu_pki as tp

NOW = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
PLATFORM = Ed25519PrivateKey.generate()


@pytest.fixture(scope="module")
def gpu():  # type: ignore[no-untyped-def]
    return tp.make_chain(fwid=b"\x11" * 48)


@pytest.fixture(scope="module")
def roots(gpu, tmp_path_factory) -> Path:  # type: ignore[no-untyped-def]
    directory = tmp_path_factory.mktemp("nv-roots")
    chain, _ = gpu
    (directory / "nvidia_device_identity_ca.pem").write_bytes(chain[-1].public_bytes(serialization.Encoding.PEM))
    return directory


def bundle_with_gpu(gpu, nonce: bytes, gpu_nonce: bytes | None = None) -> EvidenceBundle:  # type: ignore[no-untyped-def]
    chain, key = gpu
    evidence = tp.make_evidence(tp.EvidenceSpec(nonce=gpu_nonce or nonce, fwid=b"\x11" * 48), key)
    gpus = (GpuEvidence("hopper", evidence, tp.pem(chain)),)
    runtime = RuntimeData(nonce, os.urandom(32))
    report = SimTee(PLATFORM, bytes(48)).get_report(expected_report_data(runtime, gpus))
    return EvidenceBundle("sim", report, runtime, gpus=gpus)


def trust(roots: Path) -> VerifierTrust:
    return VerifierTrust(roots_dir=roots, sim_platform_key=PLATFORM.public_key())


def test_cpu_and_gpu_evidence_verify_together(gpu, roots: Path) -> None:  # type: ignore[no-untyped-def]
    nonce = os.urandom(32)
    result = verify_bundle(bundle_with_gpu(gpu, nonce), expected_nonce=nonce, now=NOW, trust=trust(roots))
    (claims,) = result.gpus
    assert claims.cc_enabled and claims.driver_version == "550.90.07"
    policy = AppraisalPolicy(allowed_tee=frozenset({"sim"}), allowed_measurements=frozenset({"00" * 48}),
                             require_gpu_cc=True, unsafe_allow_simulated_tee=True)
    appraise(result.token_claims(), policy)


def test_gpu_evidence_with_another_nonce_is_refused(gpu, roots: Path) -> None:  # type: ignore[no-untyped-def]
    nonce = os.urandom(32)
    bundle = bundle_with_gpu(gpu, nonce, gpu_nonce=os.urandom(32))
    with pytest.raises(AttestationError):
        verify_bundle(bundle, expected_nonce=nonce, now=NOW, trust=trust(roots))


def test_gpu_evidence_swapped_after_the_cpu_report_is_refused(gpu, roots: Path) -> None:  # type: ignore[no-untyped-def]
    nonce = os.urandom(32)
    bundle = bundle_with_gpu(gpu, nonce)
    chain, key = gpu
    other = tp.make_evidence(tp.EvidenceSpec(nonce=nonce, fwid=b"\x11" * 48, driver="550.90.08"), key)
    swapped = dataclasses.replace(bundle, gpus=(GpuEvidence("hopper", other, tp.pem(chain)),))
    with pytest.raises(FreshnessError):
        verify_bundle(swapped, expected_nonce=nonce, now=NOW, trust=trust(roots))


def test_gpu_under_an_untrusted_root_is_refused(gpu) -> None:  # type: ignore[no-untyped-def]
    nonce = os.urandom(32)
    with pytest.raises(AttestationError):
        verify_bundle(bundle_with_gpu(gpu, nonce), expected_nonce=nonce, now=NOW,
                      trust=VerifierTrust(sim_platform_key=PLATFORM.public_key()))  # NVIDIA's real root
