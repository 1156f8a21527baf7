"""The whole sequence with real-format TDX quotes and collateral under a generated test PKI:
collect (fake configfs-tsm) -> bundle -> verify (collateral from the verifier's own source) ->
appraise -> token -> token check."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from attestation.appraisal import AppraisalPolicy, appraise
from attestation.bundle import EvidenceBundle, RuntimeData, expected_report_data
from attestation.errors import AttestationError, FreshnessError, PolicyViolation, UnsupportedError
from attestation.tdx.collect import collect_quote
from attestation.tdx.verify import INTEL_ROOT_FILE, Collateral
from attestation.token import TokenIssuer, TokenVerifier
from attestation.tsm import DirectoryConfigfsFake, TsmReportClient
from attestation.verifier import VerifierTrust, verify_bundle
from sealed_fakes import tdx_collateral as tc
from sealed_fakes import tdx_pki as tp


@dataclasses.dataclass
class StaticCollateral:
    collateral: Collateral

    def tdx_collateral(self, fmspc: bytes, ca: str) -> Collateral:
        return self.collateral


@pytest.fixture(scope="module")
def pki() -> tp.TestPki:
    return tp.make_pki()


@pytest.fixture(scope="module")
def trust(pki: tp.TestPki, tmp_path_factory: pytest.TempPathFactory) -> VerifierTrust:
    roots = tmp_path_factory.mktemp("intel-test-root")
    (roots / INTEL_ROOT_FILE).write_bytes(pki.root.public_bytes(serialization.Encoding.PEM))
    return VerifierTrust(roots_dir=roots, tdx_collateral=StaticCollateral(tc.collateral(pki)))


def collect(pki: tp.TestPki, tmp: Path, nonce: bytes, **quote_args: object) -> EvidenceBundle:
    runtime = RuntimeData(nonce, os.urandom(32))
    fake = DirectoryConfigfsFake(lambda rd, _: tp.build_quote(pki, report_data=rd, **quote_args), "tdx_guest")
    quote = collect_quote(expected_report_data(runtime, ()), TsmReportClient(tmp, ops=fake))
    return EvidenceBundle(tee="tdx", cpu_evidence=quote, runtime_data=runtime)


def test_whole_sequence_tdx(pki: tp.TestPki, trust: VerifierTrust, tmp_path: Path) -> None:
    nonce = os.urandom(32)
    result = verify_bundle(collect(pki, tmp_path, nonce), expected_nonce=nonce, now=tp.NOW, trust=trust)
    assert result.cpu.tee == "tdx" and result.cpu.tcb_status == "UpToDate" and not result.cpu.debug
    issuer = TokenIssuer(ec.generate_private_key(ec.SECP256R1()), "sealed-key-broker")
    claims = TokenVerifier(issuer.jwks(), "sealed-key-broker").verify(
        issuer.issue(result.token_claims(), tp.NOW), tp.NOW)
    appraise(claims, AppraisalPolicy(allowed_tee=frozenset({"tdx"}),
                                     allowed_measurements=frozenset({result.cpu.measurement.hex()})))


def test_tdx_without_a_collateral_source_is_refused(pki: tp.TestPki, tmp_path: Path) -> None:
    nonce = os.urandom(32)
    with pytest.raises(UnsupportedError):
        verify_bundle(collect(pki, tmp_path, nonce), expected_nonce=nonce, now=tp.NOW, trust=VerifierTrust())


def test_tdx_bound_to_another_key_is_refused(pki: tp.TestPki, trust: VerifierTrust, tmp_path: Path) -> None:
    nonce = os.urandom(32)
    bundle = collect(pki, tmp_path, nonce)
    swapped = dataclasses.replace(bundle, runtime_data=RuntimeData(nonce, os.urandom(32)))
    with pytest.raises(FreshnessError):
        verify_bundle(swapped, expected_nonce=nonce, now=tp.NOW, trust=trust)


def test_tdx_under_shipped_intel_root_is_refused(pki: tp.TestPki, tmp_path: Path) -> None:
    nonce = os.urandom(32)
    shipped = VerifierTrust(tdx_collateral=StaticCollateral(tc.collateral(pki)))
    with pytest.raises(AttestationError):
        verify_bundle(collect(pki, tmp_path, nonce), expected_nonce=nonce, now=tp.NOW, trust=shipped)


def test_debug_td_is_refused_at_appraisal(pki: tp.TestPki, trust: VerifierTrust, tmp_path: Path) -> None:
    nonce = os.urandom(32)
    bundle = collect(pki, tmp_path, nonce, td_attributes=bytes([1]) + bytes(7))  # TUD.DEBUG
    result = verify_bundle(bundle, expected_nonce=nonce, now=tp.NOW, trust=trust)
    assert result.cpu.debug
    with pytest.raises(PolicyViolation, match="debug"):
        appraise(result.token_claims(), AppraisalPolicy(allowed_tee=frozenset({"tdx"}),
                                                        allowed_measurements=frozenset({result.cpu.measurement.hex()})))
