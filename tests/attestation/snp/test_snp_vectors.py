"""The shared real SEV-SNP vectors: golden fields, verification at pinned times, MANIFEST negatives."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pytest

from attestation.errors import (
    AttestationError,
    ChainError,
    CollateralError,
    PolicyViolation,
    SignatureError,
)
from attestation.snp import Policy, parse_report, parse_vek, to_claims, validate, verify_report
from attestation.snp.certs import VekKind
from attestation.snp.tcb import Product
from sealed_fakes.snp_bench import make_cached_verifier
from sealed_fakes.snp_pki import RealVector


def _load(snp_dir: Path, v: RealVector) -> tuple[bytes, bytes]:
    return (snp_dir / v.report).read_bytes(), (snp_dir / v.vek).read_bytes()


def test_every_snp_report_in_the_folder_is_covered(
    snp_dir: Path, facts: dict[str, Any], vectors: tuple[RealVector, ...]
) -> None:
    on_disk = {p.name for p in snp_dir.glob("*report*.bin")} | {
        p.name for p in snp_dir.glob("*attestation*.bin")
    }
    assert on_disk == {v.report for v in vectors}
    assert {f"snp/{v.report}" for v in vectors} == set(facts)


def test_golden_fields(snp_dir: Path, facts: dict[str, Any], vector: RealVector) -> None:
    v = vector
    f = facts[f"snp/{v.report}"]
    raw, _ = _load(snp_dir, v)
    r = parse_report(raw)
    assert len(raw) == f["size"]
    for name in ("version", "guest_svn", "vmpl"):
        assert getattr(r, name) == f[name], name
    assert r.signature_algo == f["sig_algo"]
    for name in ("policy", "platform_info", "signer_info"):
        assert hex(getattr(r, name)) == f[name], name
    for name in (
        "family_id",
        "image_id",
        "report_data",
        "measurement",
        "host_data",
        "id_key_digest",
        "author_key_digest",
        "report_id",
        "report_id_ma",
        "chip_id",
    ):
        assert getattr(r, name).hex() == f[name], name
    assert bytes([r.cpuid_fam_id, r.cpuid_mod_id, r.cpuid_step]).hex() == f["cpuid_fms"]
    for which in ("current", "reported", "committed", "launch"):
        want = f[f"{which}_tcb"]
        assert hex(getattr(r, f"{which}_tcb")) == want["raw"]
        assert r.tcb(which, v.product).as_dict() == {k: want[k] for k in ("bl", "tee", "snp", "ucode")}
    assert [r.current_build, r.current_minor, r.current_major] == f["current_build_minor_major"]
    assert [r.committed_build, r.committed_minor, r.committed_major] == f["committed_build_minor_major"]
    assert hex(r.launch_mit_vector) == f["launch_mit"] and hex(r.current_mit_vector) == f["current_mit"]
    assert f["verify_with"] == f"snp/{v.vek}"


def test_real_vector_verifies_at_pinned_time(
    snp_dir: Path, facts: dict[str, Any], vector: RealVector
) -> None:
    v = vector
    raw, vek = _load(snp_dir, v)
    f = facts[f"snp/{v.report}"]
    vr = verify_report(raw, vek=vek, now=v.at)
    assert vr.product is v.product and vr.signer is v.kind
    assert len(vr.chain.certs) == 3
    assert str(vr.chain.certs[0].not_valid_before_utc) == f["vek_not_before"]
    assert str(vr.chain.certs[0].not_valid_after_utc) == f["vek_not_after"]
    info = parse_vek(vek)
    if v.kind is VekKind.VCEK:
        assert info.hwid == vr.report.chip_id
    else:
        assert info.hwid is None and info.csp_id == "CN=cc-us-east-2.amazonaws.com"
    claims = to_claims(vr)
    # Honest status: UpToDate only where REPORTED_TCB is not below COMMITTED_TCB. The AWS VLEK
    # capture reports ucode 217 (the VLEK's TCB) while the firmware committed 219: its signature
    # proves no more than 217, so it is OutOfDate, not UpToDate.
    reported, committed = vr.report.tcb("reported", v.product), vr.report.tcb("committed", v.product)
    expected = "UpToDate" if reported.dominates(committed) else "OutOfDate"
    assert claims.tcb_status.value == expected
    assert (v.report == "trustee_test-vlek-report.bin") == (expected == "OutOfDate")
    assert claims.measurement.hex() == f["measurement"]
    assert claims.extra["chip_id"] == f["chip_id"] and claims.extra["product"] == v.product.value


def test_milan_product_name_and_stepping(snp_dir: Path) -> None:
    info = parse_vek((snp_dir / "gosevguest_milan_vcek.der").read_bytes())
    assert info.product is Product.MILAN and info.product_name == "Milan-B0"


def test_vlek_is_expired_at_collection_date(
    snp_dir: Path, vectors: tuple[RealVector, ...], today: dt.datetime
) -> None:
    v = vectors[2]
    raw, vek = _load(snp_dir, v)
    with pytest.raises(ChainError, match="after 2025-12-10"):
        verify_report(raw, vek=vek, now=today)
    for other in (vectors[0], vectors[1], vectors[3]):  # the VCEK chains are still valid then
        other_raw, other_vek = _load(snp_dir, other)
        verify_report(other_raw, vek=other_vek, now=today)


def test_milan_debug_policy(snp_dir: Path, vectors: tuple[RealVector, ...]) -> None:
    raw, vek = _load(snp_dir, vectors[0])
    vr = verify_report(raw, vek=vek, now=vectors[0].at)
    assert vr.report.guest_policy.debug and to_claims(vr).debug
    meas = frozenset({vr.report.measurement})
    with pytest.raises(PolicyViolation) as err:
        validate(vr, Policy(allowed_measurements=meas))
    assert err.value.violations == ["guest policy allows DEBUG"]
    validate(vr, Policy(allowed_measurements=meas, allow_debug=True))


def test_trustee_mutations(snp_dir: Path, vectors: tuple[RealVector, ...]) -> None:
    """MANIFEST 1b/1c: byte 42 breaks the signature, byte 384 (REPORTED_TCB.bl) the TCB match."""
    for v in (vectors[1], vectors[2]):
        raw, vek = _load(snp_dir, v)
        b42 = bytearray(raw)
        b42[42] += 1
        with pytest.raises(SignatureError):
            verify_report(bytes(b42), vek=vek, now=v.at)
        b384 = bytearray(raw)
        b384[384] += 1
        with pytest.raises(CollateralError, match="REPORTED_TCB"):
            verify_report(bytes(b384), vek=vek, now=v.at)
        bad_vek = bytearray(vek)
        bad_vek[42] ^= 0x01  # trustee check_vcek_signature_failure / check_vlek_signature_failure
        with pytest.raises(AttestationError):
            verify_report(raw, vek=bytes(bad_vek), now=v.at)


@pytest.mark.parametrize(
    "name", ["trustee_test-vcek-invalid-legacy.der", "trustee_test-vcek-invalid-new.der"]
)
def test_invalid_vceks_parse_but_do_not_chain(
    snp_dir: Path, name: str, vectors: tuple[RealVector, ...]
) -> None:
    info = parse_vek((snp_dir / name).read_bytes())
    assert info.hwid == bytes(range(64))  # raw in legacy, OCTET STRING-wrapped in new
    raw, _ = _load(snp_dir, vectors[1])
    with pytest.raises(AttestationError):
        verify_report(raw, vek=(snp_dir / name).read_bytes(), now=vectors[1].at)
    from attestation.snp.verify import verify_vek_chain

    with pytest.raises(ChainError):
        verify_vek_chain(info, now=dt.datetime(2025, 6, 1, tzinfo=dt.UTC))


def test_every_single_byte_flip_in_signed_region_is_rejected(snp_dir: Path, vector: RealVector) -> None:
    v = vector
    raw, vek = _load(snp_dir, v)
    verify = make_cached_verifier(vek, now=v.at)  # chain verified once; key cached
    verify(raw)
    accepted = []
    for off in range(0x2A0):
        mutated = bytearray(raw)
        mutated[off] ^= 0x01
        try:
            verify(bytes(mutated))
        except AttestationError:
            continue
        accepted.append(off)
    assert accepted == []
