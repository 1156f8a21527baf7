"""`sealed attest verify|inspect|detect` through the real command line (exit codes, JSON)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from api.cli.main import build
from sealed_fakes.tampered import TamperedCase, tampered_cases

MILAN_MEASUREMENT = ("b07af9620f3b839b47996422ddec6058338951d984e312115131ea82705eaf5b"
                     "6bdf8a9ece31a5a608eb0cf2e4872b01")
NVTRUST_NONCE = "931d8dd0add203ac3d8b4fbde75e115278eefcdceac5b87671a748f32364dfcb"


def sealed(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(build(), list(args))
    return result.exit_code, result.output


def snp_args(tv: Path) -> list[str]:
    return ["attest", "verify", "--tee", "snp", "--evidence", str(tv / "snp" / "gosevguest_milan_attestation.bin"),
            "--cert", str(tv / "snp" / "gosevguest_milan_vcek.der")]


def test_snp_verifies_and_prints_claims(testvectors: Path) -> None:
    code, out = sealed(*snp_args(testvectors), "--at", "2022-09-24T01:00:00Z", "--nonce", "0102030405", "--json")
    assert code == 0, out
    claims = json.loads(out)
    assert claims["measurement"] == MILAN_MEASUREMENT and claims["debug"] is True


def test_snp_policy_forbidding_debug_exits_2_with_the_reason(testvectors: Path, tmp_path: Path) -> None:
    policy = tmp_path / "policy.json"
    policy.write_text(json.dumps({"allowed_measurements": [MILAN_MEASUREMENT]}))
    code, out = sealed(*snp_args(testvectors), "--at", "2022-09-24T01:00:00Z", "--policy", str(policy))
    assert code == 2 and "DEBUG" in out


@pytest.mark.parametrize(("extra", "needle"), [
    (["--at", "2053-07-01T00:00:00Z"], "NOT verified"),  # after the VCEK's validity
    (["--at", "2022-09-24T01:00:00Z", "--nonce", "0102030406"], "NOT verified"),  # wrong nonce
])
def test_snp_refusals_exit_1(testvectors: Path, extra: list[str], needle: str) -> None:
    code, out = sealed(*snp_args(testvectors), *extra)
    assert code == 1 and needle in out


def test_tdx_with_collateral_and_without(testvectors: Path) -> None:
    tdx = testvectors / "tdx"
    base = ["attest", "verify", "--tee", "tdx", "--evidence", str(tdx / "trustee_tdx_quote_4.dat"),
            "--at", "2023-07-01T01:00:00Z", "--json"]
    collateral = [arg for name in ("gotdxguest_sample_tcbInfo_response", "gotdxguest_pckcrl",
                                   "gotdxguest_sample_qeIdentity_response", "gotdxguest_rootcrl.der",
                                   "gotdxguest_tcbInfoIssuerChain.pem", "gotdxguest_pckCrlIssuerChain.pem")
                  for arg in ("--collateral", str(tdx / name))]
    code, out = sealed(*base, *collateral)
    assert code == 0, out
    assert json.loads(out)["tcb_status"] == "UpToDate"
    code, out = sealed(*base, "--no-collateral")
    assert code == 0, out
    assert json.loads(out)["tcb_status"] == "Unknown"


def test_nvgpu_nonce_checked(testvectors: Path) -> None:
    nv = testvectors / "nvgpu"
    base = ["attest", "verify", "--tee", "nvgpu", "--evidence", str(nv / "nvtrust_hopperAttestationReport.bin"),
            "--cert", str(nv / "nvtrust_hopperCertChain.pem"), "--at", "2025-06-01T00:00:00Z"]
    assert sealed(*base, "--nonce", NVTRUST_NONCE)[0] == 0
    assert sealed(*base, "--nonce", "00" * 32)[0] == 1


@pytest.mark.parametrize(("path", "tee"), [("snp/gosevguest_milan_attestation.bin", "snp"),
                                           ("tdx/trustee_tdx_quote_4.dat", "tdx"),
                                           ("nvgpu/nvtrust_hopperAttestationReport.bin", "nvgpu")])
def test_inspect_detects_the_evidence_kind(testvectors: Path, path: str, tee: str) -> None:
    code, out = sealed("attest", "inspect", str(testvectors / path))
    assert code == 0, out
    assert json.loads(out)["tee"] == tee


def test_inspect_garbage_fails(tmp_path: Path) -> None:
    (tmp_path / "x").write_bytes(b"garbage")
    assert sealed("attest", "inspect", str(tmp_path / "x"))[0] == 1


def test_detect_lists_the_simulated_tee() -> None:
    code, out = sealed("attest", "detect")
    assert code == 0 and "sim" in out and "INSECURE" in out


_TAMPERED = tampered_cases(Path(__file__).resolve().parents[2] / "vectors" / "attestation")


@pytest.mark.parametrize("case", _TAMPERED, ids=[c.name for c in _TAMPERED])
def test_tampered_certificates_print_not_verified_and_a_reason(case: TamperedCase, tmp_path: Path) -> None:
    """Each input that once crashed `sealed attest verify` with a traceback is refused in one line."""
    evidence = tmp_path / "evidence"
    evidence.write_bytes(case.evidence)
    args = ["attest", "verify", "--tee", case.tee, "--evidence", str(evidence), "--at", case.at.isoformat(),
            "--no-collateral"]
    for i, blob in enumerate(case.certs):
        (tmp_path / f"cert{i}").write_bytes(blob)
        args += ["--cert", str(tmp_path / f"cert{i}")]
    result = CliRunner().invoke(build(), args)
    assert result.exit_code == 1, result.output
    assert isinstance(result.exception, SystemExit), repr(result.exception)  # not an uncaught error
    assert f"NOT verified: {case.refusal.__name__}: " in result.output
    assert "Traceback" not in result.output
