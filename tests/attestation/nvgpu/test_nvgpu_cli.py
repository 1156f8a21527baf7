"""verify_for_cli / inspect_for_cli over the shared vectors and a collected test-PKI bundle."""

from __future__ import annotations

import datetime as dt
import json
import os
from pathlib import Path

import pytest

from attestation.cli_request import VerifyRequest
from attestation.errors import CollateralError, FreshnessError, ParseError, PolicyViolation
from attestation.nvgpu.cli import inspect_for_cli, verify_for_cli
from attestation.nvgpu.collect import CollectedGpu, bundle_json
from sealed_fakes import nvgpu_pki as tp

AT = dt.datetime(2025, 6, 1, tzinfo=dt.UTC)
NVTRUST_NONCE = bytes.fromhex("931d8dd0add203ac3d8b4fbde75e115278eefcdceac5b87671a748f32364dfcb")
COCO_NONCE = bytes.fromhex("87d8e24ab336adafe228d49e83d745f6dba4ae505372b6a5704820856b343fec")
PPCIE_NONCE = bytes.fromhex("4760e30534a0621357d458b1a7936551b5dc4cd1e69718adf7ed9fb0252a537e")
RIM = "nvtrust_vbios_rim_1010_0200_882_960074001A_PROD.swidtag"


def _r(tv: Path, name: str) -> bytes:
    return (tv / "nvgpu" / name).read_bytes()


def test_hex_report_verifies(testvectors: Path) -> None:
    out = verify_for_cli(VerifyRequest(
        _r(testvectors, "nvtrust_hopperAttestationReport.hex.txt"),
        [_r(testvectors, "nvtrust_hopperCertChain.pem")],
        [],
        None,
        NVTRUST_NONCE,
        AT,
        None,
        True,
    ))
    json.dumps(out)
    (gpu,) = out["gpus"]
    assert out["fresh"] and not out["appraised"]
    assert (gpu["driver_version"], gpu["vbios_version"]) == ("550.90.07", "96.00.9F.00.01")
    assert gpu["ueid"] == "478176379286082186618948445787393647364802107249"
    assert gpu["rim_matched"] is None and gpu["ocsp_status"] == "unknown"


def test_coco_with_rim_and_policy(testvectors: Path) -> None:
    args = (
        _r(testvectors, "trustee_hopper_coco_report1.bin"),
        [_r(testvectors, "trustee_hopper_coco_certs1.txt")],
    )
    rim = [_r(testvectors, RIM)]
    out = verify_for_cli(VerifyRequest(*args, rim, None, COCO_NONCE, AT, None, True))
    assert out["gpus"][0]["rim_matched"] is False
    assert out["gpus"][0]["rim_mismatches"] == {"96.00.74.00.1A": [9]}
    unapplied = verify_for_cli(VerifyRequest(*args, rim, None, COCO_NONCE, AT, None, False))
    assert unapplied["gpus"][0]["rim_matched"] is None
    policy = {"min_driver_version": "590.0", "allowed_vbios_versions": ["96.00.74.00.1a"]}
    with pytest.raises(PolicyViolation) as err:
        verify_for_cli(VerifyRequest(*args, rim, None, COCO_NONCE, AT, policy, True))
    text = " | ".join(err.value.violations)
    assert "driver version 580.95.05" in text and "index 9" in text and "OCSP" in text
    assert "no driver RIM" in text and len(err.value.violations) == 4
    with pytest.raises(PolicyViolation, match="unknown policy key 'nope'"):
        verify_for_cli(VerifyRequest(*args, [], None, COCO_NONCE, AT, {"nope": 1}, True))
    with pytest.raises(ParseError, match="unrecognised collateral"):
        verify_for_cli(VerifyRequest(*args, [b"-----BEGIN X509 CRL-----"], None, COCO_NONCE, AT, None, True))
    with pytest.raises(CollateralError):  # a VBIOS RIM for another GPU
        verify_for_cli(VerifyRequest(
            _r(testvectors, "nvtrust_hopperAttestationReport.bin"),
            [_r(testvectors, "nvtrust_hopperCertChain.pem")],
            rim,
            None,
            NVTRUST_NONCE,
            AT,
            None,
            True,
        ))


def test_eight_gpu_json(testvectors: Path) -> None:
    blob = _r(testvectors, "nvtrust_ppcie_gpu_evidence_8gpu.json")
    out = verify_for_cli(VerifyRequest(blob, [], [], None, PPCIE_NONCE, AT, None, True))
    assert len(out["gpus"]) == 8 and {g["nonce"] for g in out["gpus"]} == {PPCIE_NONCE.hex()}
    assert {g["feature_flag"] for g in out["gpus"]} == {"PPCIE"}
    assert verify_for_cli(VerifyRequest(blob, [], [], None, None, AT, None, True))["fresh"] is False
    with pytest.raises(FreshnessError):
        verify_for_cli(VerifyRequest(blob, [], [], None, COCO_NONCE, AT, None, True))
    assert [g["index"] for g in inspect_for_cli(blob)["gpus"]] == list(range(8))


def test_inspect(testvectors: Path) -> None:
    raw = _r(testvectors, "trustee_hopper_coco_report1.bin")
    out = inspect_for_cli(raw)
    assert out["verified"] is False
    assert out["gpus"][0]["trailing_bytes"] == 1
    assert out["gpus"][0]["opaque"]["PROJECT"] == "1010"
    assert inspect_for_cli(raw.hex().encode())["gpus"] == out["gpus"]
    with pytest.raises(ParseError):
        inspect_for_cli(b"[{}]")
    with pytest.raises(ParseError):
        inspect_for_cli(b"[not json")


def test_collected_bundle_with_test_roots(tmp_path: Path) -> None:
    chain, key = tp.make_chain()
    nonce = os.urandom(32)
    evidence = tp.make_evidence(tp.EvidenceSpec(nonce=nonce), key)
    bundle = bundle_json([CollectedGpu(0, "GPU-0", evidence, tp.pem(chain))])
    (tmp_path / "nvidia_device_identity_ca.pem").write_bytes(tp.pem(chain[-1:]))
    policy = {
        "allowed_driver_versions": ["550.90.07"],
        "min_vbios_version": "96.00.9F.00.01",
        "require_rim_match": False,
        "unsafe_allow_ocsp_unknown": True,
        "expected_nonce": nonce.hex(),
    }
    out = verify_for_cli(VerifyRequest(
        bundle, [], [], tmp_path, nonce, dt.datetime(2026, 1, 1, tzinfo=dt.UTC), policy, True
    ))
    assert out["appraised"] and out["gpus"][0]["fwid"] == "11" * 48
    tampered = json.loads(bundle)
    tampered[0]["nonce"] = "00" * 32
    with pytest.raises(ParseError, match="listed nonce"):
        verify_for_cli(VerifyRequest(json.dumps(tampered).encode(), [], [], tmp_path, None, AT, None, True))
