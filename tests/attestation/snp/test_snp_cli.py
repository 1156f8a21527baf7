"""verify_for_cli and inspect_for_cli, as `sealed attest verify --tee snp` and `inspect` use them."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization

from attestation.cli_request import VerifyRequest
from attestation.errors import FreshnessError, ParseError, PolicyViolation, RevokedError
from attestation.snp.cli import inspect_for_cli, verify_for_cli
from attestation.snp.tcb import Product
from attestation.x509chain import ROOTS_DIR
from sealed_fakes.snp_pki import EPOCH, AmdTestPki, KeySet, sign_report, template_report

# MANIFEST 1a: go-sev-guest pins 2022-09-24T01:00:00Z for this VCEK.
MILAN_AT = dt.datetime(2022, 9, 24, 1, 0, tzinfo=dt.UTC)
MILAN_REPORT, MILAN_VCEK = "gosevguest_milan_attestation.bin", "gosevguest_milan_vcek.der"

MEAS = "b07af9620f3b839b47996422ddec6058338951d984e312115131ea82705eaf5b6bdf8a9ece31a5a608eb0cf2e4872b01"


def _milan(snp_dir: Path) -> tuple[bytes, bytes]:
    return (snp_dir / MILAN_REPORT).read_bytes(), (snp_dir / MILAN_VCEK).read_bytes()


def test_verify_real_milan(snp_dir: Path) -> None:
    raw, vek = _milan(snp_dir)
    policy = {
        "allowed_measurements": [MEAS],
        "allow_debug": True,
        "min_tcb": {"bl": 2, "snp": 5, "ucode": 68},
    }
    out = verify_for_cli(VerifyRequest(raw, [vek], [], None, bytes.fromhex("0102030405"), MILAN_AT, policy, True))
    json.dumps(out)
    assert out["tee"] == "snp" and out["debug"] is True and out["tcb_status"] == "UpToDate"
    assert out["measurement"] == MEAS and out["product"] == "Milan" and out["signer"] == "vcek"
    assert out["tcb"] == {"bl": 2, "tee": 0, "snp": 5, "ucode": 68, "guest_svn": 0}
    assert out["chip_id"].startswith("3ac3fe21") and out["policy"] == "0xb0000"
    # PEM certificates, the pinned ASK/ARK supplied too, and the report as hex text all work.
    pem = serialization.Encoding.PEM
    from attestation.x509chain import load_der_or_pem

    vek_pem = load_der_or_pem(vek).public_bytes(pem)
    bundle = (ROOTS_DIR / "amd_milan_ask_ark.pem").read_bytes()
    out2 = verify_for_cli(VerifyRequest(raw.hex().encode(), [vek_pem, bundle], [], ROOTS_DIR, None, MILAN_AT, None,
                                        False))
    assert out2["measurement"] == MEAS


def test_verify_rejections(snp_dir: Path) -> None:
    raw, vek = _milan(snp_dir)
    with pytest.raises(PolicyViolation) as err:
        verify_for_cli(VerifyRequest(raw, [vek], [], None, None, MILAN_AT, {"allowed_measurements": [MEAS]}, True))
    assert err.value.violations == ["guest policy allows DEBUG"]
    with pytest.raises(PolicyViolation) as err:
        verify_for_cli(VerifyRequest(raw, [vek], [], None, None, MILAN_AT, {}, True))  # default-deny: no measurement
    assert len(err.value.violations) == 2
    with pytest.raises(FreshnessError):
        verify_for_cli(VerifyRequest(raw, [vek], [], None, b"\x01\x02\x03\x04\x06", MILAN_AT, None, True))
    with pytest.raises(FreshnessError):
        verify_for_cli(VerifyRequest(raw, [vek], [], None, b"\x01" * 65, MILAN_AT, None, True))
    with pytest.raises(ParseError, match="unknown SNP policy keys"):
        verify_for_cli(VerifyRequest(raw, [vek], [], None, None, MILAN_AT, {"debug": False}, True))
    with pytest.raises(ParseError, match="CRL"):
        verify_for_cli(VerifyRequest(raw, [vek], [b"not a crl"], None, None, MILAN_AT, None, True))
    with pytest.raises(ParseError):
        verify_for_cli(VerifyRequest(raw[:-1], [vek], [], None, None, MILAN_AT, None, True))


def test_crl_collateral_switch(pkis: dict[Product, AmdTestPki], test_keys: KeySet, roots_dir: Path) -> None:
    pki = pkis[Product.MILAN]
    rep = template_report(3, Product.MILAN)
    vek = pki.make_vek(rep.tcb("reported", Product.MILAN), rep.chip_id, serial=77)
    der = vek.public_bytes(serialization.Encoding.DER)
    raw = sign_report(rep, test_keys.vek)
    crl = pki.make_crl([77], issuer="ask")
    at = EPOCH + dt.timedelta(days=5)
    out = verify_for_cli(VerifyRequest(raw, [der], [crl], roots_dir, None, at, None, False))
    assert out["crl_checked"] == "false"
    with pytest.raises(RevokedError):
        verify_for_cli(VerifyRequest(raw, [der], [crl], roots_dir, None, at, None, True))
    out = verify_for_cli(VerifyRequest(raw, [der], [pki.make_crl([1], issuer="ark")], roots_dir, None, at, None, True))
    assert out["crl_checked"] == "true"


def test_inspect(snp_dir: Path) -> None:
    out = inspect_for_cli((snp_dir / "trustee_test-vlek-report.bin").read_bytes())
    json.dumps(out)
    assert out["verified"] is False and out["version"] == 3 and out["vmpl"] == 1
    assert out["signer"]["signing_key"] == "vlek" and out["product"] == "Milan"
    assert out["reported_tcb"] == {"raw": "0xd918000000000004", "bl": 4, "tee": 0, "snp": 24, "ucode": 217}
    assert out["platform"]["alias_check_complete"] is True and out["firmware"] == "1.55.29"
    v2 = inspect_for_cli((snp_dir / "gosevguest_milan_attestation.bin").read_bytes())
    assert v2["product"] is None and v2["guest_policy"]["debug"] is True and v2["tcb_layout"] == "milan/genoa"
