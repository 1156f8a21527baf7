"""TDX evidence signed under a test Intel PKI: collect -> verify -> validate -> claims; TCB statuses."""

from __future__ import annotations

import dataclasses
import datetime as dt
from pathlib import Path
from typing import Any

import pytest

from attestation.claims import TcbStatus, TeeType
from attestation.errors import (
    ChainError,
    CollateralError,
    PolicyViolation,
    UnsupportedError,
)
from attestation.tdx import Policy, TdxVerifier, VerifyOptions, parse_quote, to_claims, validate
from attestation.tdx.collect import collect_quote
from attestation.tsm import DirectoryConfigfsFake, TsmReportClient
from sealed_fakes import tdx_collateral as tc
from sealed_fakes import tdx_pki as tp

V5 = {"version": 5, "body_type": 3, "tee_tcb_svn": bytes([6, 1, 4]) + bytes(13)}
NONCE = bytes(range(64))


@pytest.fixture(scope="module")
def pki() -> tp.TestPki:
    return tp.make_pki()


@pytest.fixture(scope="module")
def other() -> tp.TestPki:
    return tp.make_pki()


def _policy(**kw: Any) -> Policy:
    return Policy(allowed_mrtd=(tp.BODY_DEFAULTS["mr_td"],), report_data=NONCE, **kw)


@pytest.mark.parametrize(
    "shape", [{"version": 4}, {"version": 5, "body_type": 2}, V5], ids=["v4", "v5t2", "v5t3"]
)
def test_collect_verify_validate_claims(tmp_path: Path, pki: tp.TestPki, shape: dict[str, Any]) -> None:
    fake = DirectoryConfigfsFake(lambda rd, _: tp.build_quote(pki, report_data=rd, **shape), "tdx_guest")
    quote = collect_quote(NONCE, TsmReportClient(tmp_path, ops=fake))
    verified = TdxVerifier([pki.root]).verify(quote, tp.NOW, tc.collateral(pki))
    validate(verified, _policy(rtmrs=(b"\x10" * 48, None, None, bytes(48)), min_tee_tcb_svn=bytes(16)))
    claims = to_claims(verified)
    assert claims.tee is TeeType.TDX and claims.tcb_status is TcbStatus.UP_TO_DATE
    assert claims.measurement == tp.BODY_DEFAULTS["mr_td"] and claims.report_data == NONCE
    assert not claims.debug and claims.extra["fmspc"] == tp.FMSPC.hex()
    assert claims.extra["tdx_module_identity" if shape is V5 else "rtmr0"]
    assert claims.to_json()["tcb_status"] == "UpToDate"
    assert list(tmp_path.iterdir()) == []  # the configfs entry was removed


def test_collect_refuses_other_provider(tmp_path: Path, pki: tp.TestPki) -> None:
    fake = DirectoryConfigfsFake(lambda rd, _: tp.build_quote(pki, report_data=rd), "sev_guest")
    with pytest.raises(UnsupportedError):
        collect_quote(NONCE, TsmReportClient(tmp_path, ops=fake))


@pytest.mark.tee
def test_collect_on_real_tdx_hardware() -> None:
    quote = collect_quote(NONCE)
    assert parse_quote(quote).body.report_data == NONCE


STATUSES = [s for s in TcbStatus if s is not TcbStatus.UNKNOWN]


@pytest.mark.parametrize("status", STATUSES)
def test_platform_status_and_advisories(pki: tp.TestPki, status: TcbStatus) -> None:
    levels = tc.default_tcb_levels()
    levels[0] = {**levels[0], "tcbStatus": status.value, "advisoryIDs": ["INTEL-SA-00999"]}
    v = TdxVerifier([pki.root]).verify(tp.build_quote(pki), tp.NOW, tc.collateral(pki, levels=levels))
    assert v.tcb is not None and v.tcb.status is status and v.tcb.advisory_ids == ("INTEL-SA-00999",)
    claims = to_claims(v)
    assert claims.tcb_status is status and claims.advisory_ids == ("INTEL-SA-00999",)
    if status is not TcbStatus.UP_TO_DATE:
        with pytest.raises(PolicyViolation, match=f"TCB status {status.value}"):
            validate(v, Policy(unsafe_allow_any_mrtd=True))


@pytest.mark.parametrize(
    ("platform", "expected"),
    [
        (TcbStatus.UP_TO_DATE, TcbStatus.OUT_OF_DATE),
        (TcbStatus.CONFIGURATION_NEEDED, TcbStatus.OUT_OF_DATE_CONFIGURATION_NEEDED),
        (TcbStatus.REVOKED, TcbStatus.REVOKED),
    ],
)
def test_out_of_date_module_and_qe_downgrade(
    pki: tp.TestPki, platform: TcbStatus, expected: TcbStatus
) -> None:
    levels = tc.default_tcb_levels()
    levels[0] = {**levels[0], "tcbStatus": platform.value}
    quote = tp.build_quote(pki, **{**V5, "tee_tcb_svn": bytes([3, 1, 4]) + bytes(13)}, qe_isvsvn=5)
    v = TdxVerifier([pki.root]).verify(quote, tp.NOW, tc.collateral(pki, levels=levels))
    assert v.tcb is not None and v.tcb.status is expected
    assert (v.tcb.module_status, v.tcb.qe_status) == (TcbStatus.OUT_OF_DATE, TcbStatus.OUT_OF_DATE)
    assert v.tcb.advisory_ids == ("INTEL-SA-00002", "INTEL-SA-00003")


def test_qe_below_all_levels_is_revoked(pki: tp.TestPki) -> None:
    v = TdxVerifier([pki.root]).verify(tp.build_quote(pki, qe_isvsvn=1), tp.NOW, tc.collateral(pki))
    assert v.tcb is not None and v.tcb.status is TcbStatus.REVOKED and v.tcb.qe_status is TcbStatus.REVOKED


def test_policy_reports_every_violation(pki: tp.TestPki) -> None:
    quote = tp.build_quote(pki, td_attributes=bytes.fromhex("0100001000000000"))
    v = TdxVerifier([pki.root], options=VerifyOptions(use_collateral=False)).verify(quote, tp.NOW)
    policy = Policy(
        allowed_mrtd=(b"\x01" * 48,),
        rtmrs=(b"\x00" * 48, None, None, None),
        mr_config_id=b"\x01" * 48,
        mr_owner=b"\x02" * 48,
        report_data=NONCE,
        xfam=bytes(8),
        min_tee_tcb_svn=b"\x09" * 16,
        allowed_mr_seam=(b"\x03" * 48,),
        min_qe_isvsvn=9,
    )
    with pytest.raises(PolicyViolation) as err:
        validate(v, policy)
    assert len(err.value.violations) == 11  # incl. debug and Unknown TCB status


def test_policy_from_dict() -> None:
    p = Policy.from_dict(
        {
            "allowed_mrtd": ["7d" * 48],
            "rtmrs": [None, "11" * 48, None, None],
            "allowed_tcb_statuses": ["UpToDate", "SWHardeningNeeded"],
            "min_qe_isvsvn": 4,
        }
    )
    assert p.allowed_mrtd == (b"\x7d" * 48,) and p.rtmrs[1] == b"\x11" * 48 and p.min_qe_isvsvn == 4
    for bad in (
        {"allowed_mrtds": []},
        {"allowed_tcb_statuses": ["Revoked"]},
        {"xfam": "00"},
        {"unsafe_allow_debug": "yes"},
        {"rtmrs": ["00" * 48]},
    ):
        with pytest.raises(ValueError):
            Policy.from_dict(bad)


def test_verifier_cache_respects_now(pki: tp.TestPki) -> None:
    verifier = TdxVerifier([pki.root])
    quote, c = tp.build_quote(pki), tc.collateral(pki)
    verifier.verify(quote, tp.NOW, c)
    with pytest.raises(ChainError, match="CRL expired"):
        verifier.verify(quote, tp.NOW + dt.timedelta(days=25), c)
    lax = TdxVerifier([pki.root], options=VerifyOptions(unsafe_skip_crls=True))
    bare = dataclasses.replace(c, pck_crl=None, root_crl=None)
    lax.verify(quote, tp.NOW, bare)
    with pytest.raises(CollateralError, match="expired"):
        lax.verify(quote, tp.NOW + dt.timedelta(days=25), bare)
    with pytest.raises(ChainError):
        verifier.verify(quote, tp.T0 + dt.timedelta(days=4000), c)
    verifier.verify(quote, tp.NOW, c)


def test_naive_now_rejected(pki: tp.TestPki) -> None:
    with pytest.raises(ValueError):
        TdxVerifier([pki.root]).verify(tp.build_quote(pki), dt.datetime(2026, 1, 1), tc.collateral(pki))
