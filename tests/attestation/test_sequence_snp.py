"""The whole attestation sequence with real-format SNP evidence signed under generated test roots:
collect (fake configfs-tsm) -> bundle -> verify -> appraise -> token -> token check."""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from attestation.appraisal import AppraisalPolicy, appraise
from attestation.bundle import EvidenceBundle, RuntimeData, expected_report_data
from attestation.errors import AttestationError, ChainError, FreshnessError, PolicyViolation
from attestation.snp.tcb import Product
from attestation.token import TokenIssuer, TokenVerifier
from attestation.tsm import DirectoryConfigfsFake, TsmReportClient
from attestation.verifier import VerifierTrust, verify_bundle
from sealed_fakes.snp_pki import EPOCH, generate_keys, make_pki, sign_report, template_report

NOW = EPOCH + dt.timedelta(days=10)
DEBUG_BIT = 1 << 19


@pytest.fixture(scope="module")
def pki():  # type: ignore[no-untyped-def]
    return make_pki(generate_keys(2048), Product.MILAN)


@pytest.fixture(scope="module")
def roots(pki, tmp_path_factory) -> Path:  # type: ignore[no-untyped-def]
    return pki.write_roots(tmp_path_factory.mktemp("amd-test-roots"))


def fake_configfs(base: Path, raw_report: bytes) -> TsmReportClient:
    """The product's configfs-tsm client over a directory that plays the kernel: a write to inblob
    yields the signed report in outblob."""
    base.mkdir(parents=True, exist_ok=True)
    return TsmReportClient(base, ops=DirectoryConfigfsFake(lambda inblob, privlevel: raw_report, "sev_guest"))


def collect_bundle(pki, tmp: Path, nonce: bytes, **report_fields: object) -> EvidenceBundle:  # type: ignore[no-untyped-def]
    runtime = RuntimeData(nonce=nonce, hpke_public_key=os.urandom(32))
    report_data = expected_report_data(runtime, ())
    report = template_report(3, Product.MILAN, report_data=report_data, **report_fields)
    raw = sign_report(report, pki.keys.vek)
    evidence = fake_configfs(tmp / "report", raw).get_report(report_data)
    vek = pki.make_vek(report.tcb("reported", Product.MILAN), report.chip_id)
    return EvidenceBundle(tee="snp", cpu_evidence=evidence.outblob, runtime_data=runtime,
                          cpu_certificates=(vek.public_bytes(serialization.Encoding.DER),))


POLICY = AppraisalPolicy(allowed_tee=frozenset({"snp"}), allowed_measurements=frozenset({bytes(range(48)).hex()}),
                         min_tcb={"snp": 8})


def test_whole_sequence_snp(pki, roots: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    nonce = os.urandom(32)
    bundle = collect_bundle(pki, tmp_path, nonce)
    result = verify_bundle(bundle, expected_nonce=nonce, now=NOW, trust=VerifierTrust(roots_dir=roots))
    assert result.cpu.tee == "snp" and not result.insecure and not result.cpu.debug
    issuer = TokenIssuer(ec.generate_private_key(ec.SECP256R1()), "sealed-key-broker")
    token = issuer.issue(result.token_claims(), NOW)
    claims = TokenVerifier(issuer.jwks(), "sealed-key-broker").verify(token, NOW)
    appraise(claims, POLICY)
    assert claims["runtime_data"]["nonce"] == nonce.hex() and claims["insecure"] is False


def test_sequence_refuses_debug_guest_at_appraisal(pki, roots: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    nonce = os.urandom(32)
    policy = template_report(3, Product.MILAN).policy | DEBUG_BIT
    bundle = collect_bundle(pki, tmp_path, nonce, policy=policy)
    result = verify_bundle(bundle, expected_nonce=nonce, now=NOW, trust=VerifierTrust(roots_dir=roots))
    with pytest.raises(PolicyViolation, match="debug"):
        appraise(result.token_claims(), POLICY)


def test_sequence_refuses_shipped_roots_for_test_evidence(pki, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    nonce = os.urandom(32)
    bundle = collect_bundle(pki, tmp_path, nonce)
    with pytest.raises(ChainError):
        verify_bundle(bundle, expected_nonce=nonce, now=NOW, trust=VerifierTrust())  # real AMD roots


def test_sequence_refuses_report_bound_to_other_runtime_data(pki, roots: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    nonce = os.urandom(32)
    bundle = collect_bundle(pki, tmp_path, nonce)
    swapped = dataclasses.replace(bundle, runtime_data=RuntimeData(nonce, os.urandom(32)))
    with pytest.raises(FreshnessError):
        verify_bundle(swapped, expected_nonce=nonce, now=NOW, trust=VerifierTrust(roots_dir=roots))


def test_sequence_refuses_expired_vcek(pki, roots: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    nonce = os.urandom(32)
    bundle = collect_bundle(pki, tmp_path, nonce)
    with pytest.raises(AttestationError):
        verify_bundle(bundle, expected_nonce=nonce, now=EPOCH + dt.timedelta(days=4000),
                      trust=VerifierTrust(roots_dir=roots))
