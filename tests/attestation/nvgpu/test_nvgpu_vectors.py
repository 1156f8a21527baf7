"""Real NVIDIA Hopper evidence from the shared set: golden fields, verification, the negatives."""

from __future__ import annotations

import base64
import datetime as dt
import json
from pathlib import Path

import pytest

from attestation.errors import ChainError, CollateralError, FreshnessError, ParseError, SignatureError
from attestation.nvgpu import (
    GpuVerifyOptions,
    Policy,
    VerifiedGpu,
    parse_evidence,
    to_claims,
    validate,
    verify_gpu_evidence,
    verify_gpu_list,
)
from attestation.nvgpu.rim import compare_rim, parse_rim, verify_rim
from attestation.ocsp import OfflineOcspChecker
from attestation.x509chain import load_pem_chain, load_pinned_roots

NOW = dt.datetime(2025, 6, 1, tzinfo=dt.UTC)  # RIM signer expired 2025-09-05: pin before it
NVTRUST_NONCE = bytes.fromhex("931d8dd0add203ac3d8b4fbde75e115278eefcdceac5b87671a748f32364dfcb")
COCO_NONCE = bytes.fromhex("87d8e24ab336adafe228d49e83d745f6dba4ae505372b6a5704820856b343fec")
PPCIE_NONCE = bytes.fromhex("4760e30534a0621357d458b1a7936551b5dc4cd1e69718adf7ed9fb0252a537e")
RIM = "nvtrust_vbios_rim_1010_0200_882_960074001A_PROD.swidtag"


def _read(tv: Path, name: str) -> bytes:
    return (tv / "nvgpu" / name).read_bytes()


def _facts(tv: Path) -> dict:
    return json.loads((tv / "computed_facts.json").read_text())["nvgpu"]


def test_hex_and_bin_are_the_same_report(testvectors: Path) -> None:
    assert bytes.fromhex(_read(testvectors, "nvtrust_hopperAttestationReport.hex.txt").decode()) == _read(
        testvectors, "nvtrust_hopperAttestationReport.bin"
    )


@pytest.mark.parametrize("name", ["nvtrust_hopperAttestationReport.bin", "trustee_hopper_coco_report1.bin"])
def test_parsed_fields_equal_computed_facts(testvectors: Path, name: str) -> None:
    facts = _facts(testvectors)[f"nvgpu/{name}"]
    ev = parse_evidence(_read(testvectors, name))
    assert ev.nonce.hex() == facts["nonce"]
    assert ev.request.slot == facts["slot"] == 0
    assert len(ev.blocks) == facts["num_blocks"] == 64
    assert {str(k): v.hex() for k, v in ev.measurements.items()} == facts["measurements"]
    assert ev.responder_nonce.hex() == facts["responder_nonce"]
    assert ev.trailing == facts["trailing_after_sig"]
    assert len(ev.signed) == facts["signed_bytes"]
    info = ev.info()
    for key, want in facts["opaque"].items():
        got = info[key] if key != "VBIOS_VERSION" else f"{info[key]} (raw {ev.field(key).hex()})"
        assert got == want, key


def test_nvtrust_report_equals_trustee_claims(testvectors: Path) -> None:
    claims = json.loads(_read(testvectors, "trustee_hopperAttestationReport-claims.txt"))
    ev = parse_evidence(_read(testvectors, "nvtrust_hopperAttestationReport.bin"))
    assert {str(k): v.hex() for k, v in ev.measurements.items()} == claims["measurements"]
    cfg = claims["config"]
    assert ev.driver_version == cfg["driver_version"] == "550.90.07"
    assert ev.vbios_version.lower() == cfg["vbios_version"]
    assert ev.fwid.hex() == cfg["fwid"]
    info = ev.info()
    for key in ("board_id", "chip_sku", "chip_sku_mod", "project", "project_sku", "gpu_info"):
        assert info[key.upper()] == cfg[key], key
    assert info["CPRINFO"] == cfg["cpr_info"]
    assert ev.field("NVDEC0_STATUS").decode() == cfg["nvdec0_status"]
    assert ev.field("PROJECT_SKU_MOD").hex() == cfg["project_sku_mod"]
    assert {str(k): n for k, n in ev.measurement_counts.items()} == cfg["measurement_count"]


def test_nvtrust_sample_verifies(testvectors: Path) -> None:
    chain = load_pem_chain(_read(testvectors, "nvtrust_hopperCertChain.pem"))
    v = verify_gpu_evidence(
        _read(testvectors, "nvtrust_hopperAttestationReport.bin"), chain, nonce=NVTRUST_NONCE, now=NOW
    )
    assert (
        v.ueid == _facts(testvectors)["nvgpu/nvtrust_hopperAttestationReport.bin"]["leaf_x509_serial_decimal"]
    )
    assert v.evidence.fwid.hex().startswith("f5c384ae")
    assert v.rim_matched is None
    c = to_claims(v, 0)
    assert (c.driver_version, c.vbios_version, c.cc_enabled) == ("550.90.07", "96.00.9F.00.01", True)
    pem = _read(testvectors, "nvtrust_hopperCertChain.pem")  # PEM bytes are accepted as well
    assert verify_gpu_evidence(v.evidence, pem, nonce=NVTRUST_NONCE, now=NOW).ueid == v.ueid
    # trustee's separately shipped signing cert is the same leaf
    assert chain[0] == load_pem_chain(_read(testvectors, "trustee_hopper_signing_cert.pem"))[0]
    assert chain[-1] == load_pinned_roots("nvidia_device_identity_ca.pem")[0]


def test_wrong_nonce_is_freshness_error(testvectors: Path) -> None:
    chain = load_pem_chain(_read(testvectors, "nvtrust_hopperCertChain.pem"))
    # nvtrust BaseSettings.NONCE (config.py L65) does not belong to this report
    stale = bytes.fromhex("4cff7f5380ead8fad8ec2c531c110aca4302a88f603792801a8ca29ee151af2e")
    with pytest.raises(FreshnessError):
        verify_gpu_evidence(
            _read(testvectors, "nvtrust_hopperAttestationReport.bin"), chain, nonce=stale, now=NOW
        )
    report = _read(testvectors, "nvtrust_hopperAttestationReport.bin")
    for bad in (None, NVTRUST_NONCE[:16]):
        with pytest.raises(FreshnessError, match="must be 32 bytes"):
            verify_gpu_evidence(report, chain, nonce=bad, now=NOW)  # type: ignore[arg-type]


def _coco(tv: Path, raw: bytes | None = None, rims: tuple[bytes, ...] = ()) -> VerifiedGpu:
    chain = load_pem_chain(_read(tv, "trustee_hopper_coco_certs1.txt"))
    return verify_gpu_evidence(
        raw or _read(tv, "trustee_hopper_coco_report1.bin"), chain, nonce=COCO_NONCE, now=NOW,
        options=GpuVerifyOptions(rims=rims),
    )


def test_coco_report_trailing_byte(testvectors: Path) -> None:
    raw = _read(testvectors, "trustee_hopper_coco_report1.bin")
    assert raw[-1] == 0 and len(raw) == 4130
    assert _coco(testvectors).evidence.trailing == 1
    assert _coco(testvectors, raw[:-1]).evidence.trailing == 0  # without the pad it still verifies
    with pytest.raises(ParseError, match="after the signature"):
        _coco(testvectors, raw + b"\x00")
    with pytest.raises(ParseError, match="after the signature"):
        _coco(testvectors, raw[:-1] + b"\x01")


def test_coco_versions_and_policy(testvectors: Path) -> None:
    v = _coco(testvectors)
    assert (v.evidence.driver_version, v.evidence.vbios_version) == ("580.95.05", "96.00.74.00.1A")
    assert v.evidence.feature_flag == "SPT"
    ok = Policy(
        min_driver_version="580.0",
        allowed_vbios_versions=frozenset({"96.00.74.00.1A"}),
        require_rim_match=False,
        unsafe_allow_ocsp_unknown=True,
    )
    assert validate(v, ok)[0].driver_version == "580.95.05"
    bad = Policy(
        min_driver_version="590.12",
        min_vbios_version="96.00.A5.00.01",
        require_rim_match=False,
        unsafe_allow_ocsp_unknown=True,
    )
    with pytest.raises(Exception) as err:
        validate(v, bad)
    assert len(err.value.violations) == 2  # type: ignore[attr-defined]


def test_rim_signature_chain_and_index_9_mismatch(testvectors: Path) -> None:
    rim_blob = _read(testvectors, RIM)
    v = _coco(testvectors, rims=(rim_blob,))
    assert v.rims[0].signer.startswith("CN=HCC RIM L4 Signer")
    (result,) = v.rim_results
    assert result.checked == (0, 1, 2, 3, 4, 5, 6, 8, 9, 10, 11, 12)  # 12 active indices
    assert result.mismatched == (9,)  # MANIFEST 3b: exactly index 9 differs
    assert v.rim_matched is False
    pol = Policy(
        min_driver_version="580.0", min_vbios_version="96.00.74.00.1A", unsafe_allow_ocsp_unknown=True
    )
    with pytest.raises(Exception, match=r"96\.00\.74\.00\.1A index 9") as err:
        validate(v, pol)
    # the index-9 mismatch, and no driver RIM (none in the shared set matches this report)
    assert err.value.violations == [  # type: ignore[attr-defined]
        "GPU 0: no driver RIM was provided",
        "GPU 0: measurements do not match the RIM (96.00.74.00.1A index 9)",
    ]


def test_rim_expired_signer_and_tampering(testvectors: Path) -> None:
    rim_blob = _read(testvectors, RIM)
    roots = load_pinned_roots("nvidia_rim_root.pem")
    with pytest.raises(ChainError, match="after"):
        verify_rim(rim_blob, roots, dt.datetime(2026, 11, 29, tzinfo=dt.UTC), OfflineOcspChecker())
    tampered = rim_blob.replace(b'index="9" active="True"', b'index="9" active="False"')
    with pytest.raises(SignatureError):
        verify_rim(tampered, roots, NOW, OfflineOcspChecker())
    with pytest.raises(ChainError):
        verify_rim(rim_blob, load_pinned_roots("nvidia_device_identity_ca.pem"), NOW, OfflineOcspChecker())
    assert compare_rim(parse_rim(rim_blob), {}).mismatched == (0, 1, 2, 3, 4, 5, 6, 8, 9, 10, 11, 12)


def test_rim_for_other_version_is_collateral_error(testvectors: Path) -> None:
    chain = load_pem_chain(_read(testvectors, "nvtrust_hopperCertChain.pem"))
    with pytest.raises(CollateralError):
        verify_gpu_evidence(
            _read(testvectors, "nvtrust_hopperAttestationReport.bin"),
            chain,
            nonce=NVTRUST_NONCE,
            now=NOW,
            options=GpuVerifyOptions(rims=(_read(testvectors, RIM),)),
        )


@pytest.mark.parametrize(
    ("case", "match"),
    [("case2", "at least the root CA"), ("case3", "issuer name does not match"), ("case4", "FWID extension")],
)
def test_trustee_chain_negatives(testvectors: Path, case: str, match: str) -> None:
    chain = load_pem_chain(_read(testvectors, f"trustee_hopper_cert_chain_{case}.txt"))
    with pytest.raises(ChainError, match=match):
        verify_gpu_evidence(
            _read(testvectors, "nvtrust_hopperAttestationReport.bin"), chain, nonce=NVTRUST_NONCE, now=NOW
        )


def test_swapped_chain_fails(testvectors: Path) -> None:
    other = load_pem_chain(_read(testvectors, "trustee_hopper_coco_certs1.txt"))
    with pytest.raises(SignatureError):
        verify_gpu_evidence(
            _read(testvectors, "nvtrust_hopperAttestationReport.bin"), other, nonce=NVTRUST_NONCE, now=NOW
        )


def _ppcie(tv: Path) -> list[dict]:
    return json.loads(_read(tv, "nvtrust_ppcie_gpu_evidence_8gpu.json"))


def test_eight_gpu_list(testvectors: Path) -> None:
    entries = _ppcie(testvectors)
    items = [
        (base64.b64decode(e["evidence"]), load_pem_chain(base64.b64decode(e["certificate"]))) for e in entries
    ]
    out = verify_gpu_list(items, nonce=PPCIE_NONCE, now=NOW)
    assert len(out) == 8
    facts = _facts(testvectors)["nvgpu/nvtrust_ppcie_gpu_evidence_8gpu.json"]
    for v, e, f in zip(out, entries, facts, strict=True):
        assert v.evidence.nonce.hex() == e["nonce"] == PPCIE_NONCE.hex()
        assert v.evidence.driver_version == e["driver_version"] == "590.12"
        assert v.evidence.vbios_version == e["vbios_version"] == "96.00.A5.00.01"
        assert v.evidence.feature_flag == "PPCIE"
        assert v.ueid == f["leaf_x509_serial_decimal"]
        assert v.evidence.info()["FWID"] == f["opaque"]["FWID"]
    assert len({v.ueid for v in out}) == 8
    with pytest.raises(FreshnessError):
        verify_gpu_list(items, nonce=NVTRUST_NONCE, now=NOW)
    with pytest.raises(ChainError, match="same device certificate"):
        verify_gpu_list([items[0], items[0]], nonce=PPCIE_NONCE, now=NOW)
    claims = validate(
        out,
        Policy(
            allowed_driver_versions=frozenset({"590.12"}),
            min_vbios_version="96.00.A5.00.01",
            require_rim_match=False,
            unsafe_allow_ocsp_unknown=True,
            expected_gpu_count=8,
        ),
    )
    assert [c.index for c in claims] == list(range(8))
