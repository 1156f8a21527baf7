"""`sealed attest verify|inspect --tee tdx` entry points."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.serialization import Encoding

from attestation.cli_request import VerifyRequest
from attestation.errors import ChainError, CollateralError, FreshnessError, PolicyViolation
from attestation.tdx.cli import inspect_for_cli, verify_for_cli
from attestation.tdx.verify import INTEL_ROOT_FILE
from sealed_fakes import tdx_collateral as tc
from sealed_fakes import tdx_pki as tp

NONCE = b"\x42" * 64


@pytest.fixture(scope="module")
def pki() -> tp.TestPki:
    return tp.make_pki()


@pytest.fixture
def roots_dir(tmp_path: Path, pki: tp.TestPki) -> Path:
    (tmp_path / INTEL_ROOT_FILE).write_bytes(pki.root.public_bytes(Encoding.PEM))
    return tmp_path


def _pile(pki: tp.TestPki) -> list[bytes]:
    c = tc.collateral(pki)
    return [c.root_crl or b"", c.tcb_info, c.pck_crl or b"", c.qe_identity]


def test_verify_synthetic(pki: tp.TestPki, roots_dir: Path) -> None:
    quote = tp.build_quote(pki, report_data=NONCE)
    policy = {"allowed_mrtd": [tp.BODY_DEFAULTS["mr_td"].hex()], "report_data": NONCE.hex()}
    out = verify_for_cli(VerifyRequest(quote, [pki.signing_chain_pem()], _pile(pki), roots_dir, NONCE, tp.NOW, policy,
                                       True))
    json.dumps(out)
    assert out["tee"] == "tdx" and out["tcb_status"] == "UpToDate" and out["crls_checked"] is True
    assert out["measurement"] == tp.BODY_DEFAULTS["mr_td"].hex() and out["rtmr0"] == "10" * 48
    short = tp.build_quote(pki, report_data=b"abc" + bytes(61))
    bare = verify_for_cli(VerifyRequest(short, [], [], roots_dir, b"abc", tp.NOW, None, False))
    assert bare["tcb_status"] == "Unknown"


def test_verify_errors(pki: tp.TestPki, roots_dir: Path) -> None:
    quote = tp.build_quote(pki, td_attributes=bytes.fromhex("0100001000000000"))
    with pytest.raises(FreshnessError):
        verify_for_cli(VerifyRequest(quote, [], [], roots_dir, NONCE, tp.NOW, None, False))
    with pytest.raises(PolicyViolation, match="unknown TDX policy keys: bogus"):
        verify_for_cli(VerifyRequest(quote, [], [], roots_dir, None, tp.NOW, {"bogus": 1}, False))
    with pytest.raises(PolicyViolation) as err:
        verify_for_cli(VerifyRequest(quote, [], [], roots_dir, None, tp.NOW, {}, False))
    assert len(err.value.violations) == 3  # MRTD, debug, Unknown TCB status
    with pytest.raises(CollateralError, match="signing_chain"):
        verify_for_cli(VerifyRequest(quote, [], _pile(pki), roots_dir, None, tp.NOW, None, True))
    with pytest.raises(ChainError):
        verify_for_cli(VerifyRequest(quote, [], [], None, None, tp.NOW, None, False))  # shipped Intel root


def test_verify_real_quote_with_shipped_root(testvectors: Path) -> None:
    tdx = testvectors / "tdx"
    names = [
        "gotdxguest_sample_tcbInfo_response",
        "gotdxguest_pckcrl",
        "gotdxguest_sample_qeIdentity_response",
        "gotdxguest_rootcrl.der",
        "gotdxguest_tcbInfoIssuerChain.pem",
        "gotdxguest_pckCrlIssuerChain.pem",
        "trustee_tcbInfo_00A06D080000.json",
    ]
    pile = [(tdx / n).read_bytes() for n in names]
    at = dt.datetime(2023, 7, 1, 1, tzinfo=dt.UTC)
    quote = (tdx / "trustee_tdx_quote_4.dat").read_bytes()
    out = verify_for_cli(VerifyRequest(quote, [], pile, None, None, at, None, True))
    assert out["tcb_status"] == "UpToDate" and out["debug"] is True and out["fmspc"] == "50806f000000"


def test_inspect(testvectors: Path) -> None:
    for name, version, fmspc in [("gotdxguest_quote_v5_sample.dat", 5, "90c06f000000"),
                                 ("gotdxguest_cos-113-tdx-quote.dat", 4, "00806f050000")]:  # fmt: skip
        out = inspect_for_cli((testvectors / "tdx" / name).read_bytes())
        json.dumps(out)
        assert (
            out["verified"] is False and out["header"]["version"] == version and out["pck"]["fmspc"] == fmspc
        )
