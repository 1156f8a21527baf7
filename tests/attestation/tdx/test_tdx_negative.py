"""Negative table: each broken quote, chain, collateral or policy raises its specific typed error."""

from __future__ import annotations

import dataclasses
import datetime as dt
import struct
from collections.abc import Callable
from typing import Any

import pytest

from attestation.errors import (
    ChainError,
    CollateralError,
    ParseError,
    PolicyViolation,
    RevokedError,
    SignatureError,
    UnsupportedError,
)
from attestation.tdx import Collateral, Policy, TdxVerifier, VerifyOptions, validate
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


def _patch(data: bytes, offset: int, fmt: str, value: int) -> bytes:
    out = bytearray(data)
    struct.pack_into(fmt, out, offset, value)
    return bytes(out)


def _flip(data: bytes, offset: int) -> bytes:
    """One byte inverted: always a change (setting a signature byte to 0 changed nothing when the
    freshly generated signature already had 0 there, 1 run in 256: seen 2026-12-02)."""
    out = bytearray(data)
    out[offset] ^= 0xFF
    return bytes(out)


@dataclasses.dataclass
class Case:
    quote: bytes
    collateral: Collateral | None
    roots: list[Any]
    now: dt.datetime = tp.NOW
    options: VerifyOptions = dataclasses.field(default_factory=VerifyOptions)
    policy: Policy | None = None


def _tamper_tcb_info(c: Collateral) -> Collateral:
    return dataclasses.replace(
        c, tcb_info=c.tcb_info.replace(b'"tcbEvaluationDataNumber":18', b'"tcbEvaluationDataNumber":19')
    )


def _signing_by(pki: tp.TestPki, other: tp.TestPki) -> Collateral:
    c = tc.collateral(pki)
    return dataclasses.replace(c, tcb_info=tc.tcb_info(other))


Build = Callable[[tp.TestPki, tp.TestPki], Case]
NEGATIVES: list[tuple[str, Build, type[Exception], str]] = [
    ("wrong_root", lambda p, o: Case(tp.build_quote(p), tc.collateral(p), [o.root]), ChainError, "pinned"),
    (
        "expired_collateral",
        lambda p, o: Case(
            tp.build_quote(p), tc.collateral(p, issue=tp.NOW - dt.timedelta(days=60)), [p.root]
        ),
        CollateralError,
        "tcbInfo has expired",
    ),
    (
        "not_yet_valid_collateral",
        lambda p, o: Case(tp.build_quote(p), tc.collateral(p, issue=tp.NOW + dt.timedelta(days=1)), [p.root]),
        CollateralError,
        "not yet valid",
    ),
    (
        "revoked_pck",
        lambda p, o: Case(tp.build_quote(p), tc.collateral(p, revoked_pck=True), [p.root]),
        RevokedError,
        "PCK Certificate",
    ),
    (
        "tampered_tcb_info",
        lambda p, o: Case(tp.build_quote(p), _tamper_tcb_info(tc.collateral(p)), [p.root]),
        SignatureError,
        "tcbInfo",
    ),
    (
        "tcb_info_wrong_signer",
        lambda p, o: Case(tp.build_quote(p), _signing_by(p, o), [p.root]),
        SignatureError,
        "tcbInfo",
    ),
    (
        "signing_chain_foreign",
        lambda p, o: Case(
            tp.build_quote(p),
            dataclasses.replace(tc.collateral(p), signing_chain=o.signing_chain_pem()),
            [p.root],
        ),
        ChainError,
        "signing chain",
    ),
    (
        "qe_binding_mismatch",
        lambda p, o: Case(tp.build_quote(p, bind=False), tc.collateral(p), [p.root]),
        SignatureError,
        "QE report data",
    ),
    (
        "wrong_qe_mrsigner",
        lambda p, o: Case(tp.build_quote(p, qe_mrsigner=b"\x01" * 32), tc.collateral(p), [p.root]),
        CollateralError,
        "MRSIGNER",
    ),
    (
        "debug_td",
        lambda p, o: Case(
            tp.build_quote(p, report_data=NONCE, td_attributes=bytes.fromhex("0100001000000000")),
            tc.collateral(p),
            [p.root],
            policy=_policy(),
        ),
        PolicyViolation,
        "debug",
    ),
    ("truncated", lambda p, o: Case(tp.build_quote(p)[:-1], None, [p.root]), ParseError, "truncated"),
    ("truncated_header", lambda p, o: Case(tp.build_quote(p)[:40], None, [p.root]), ParseError, "truncated"),
    (
        "bad_sig_data_len",
        lambda p, o: Case(_patch(tp.build_quote(p), 632, "<I", 100), None, [p.root]),
        ParseError,
        "signature data",
    ),
    (
        "bad_v5_body_size",
        lambda p, o: Case(_patch(tp.build_quote(p, **V5), 50, "<I", 584), None, [p.root]),
        ParseError,
        "648",
    ),
    (
        "bad_cert_size",
        lambda p, o: Case(_patch(tp.build_quote(p), 636 + 130, "<I", 10), None, [p.root]),
        ParseError,
        "certificate data",
    ),
    (
        "bad_qe_auth_len",
        lambda p, o: Case(_patch(tp.build_quote(p), 636 + 134 + 448, "<H", 60000), None, [p.root]),
        ParseError,
        "auth data",
    ),
    (
        "unsupported_version",
        lambda p, o: Case(_patch(tp.build_quote(p), 0, "<H", 3), None, [p.root]),
        UnsupportedError,
        "version 3",
    ),
    (
        "unsupported_att_key",
        lambda p, o: Case(_patch(tp.build_quote(p), 2, "<H", 3), None, [p.root]),
        UnsupportedError,
        "key type",
    ),
    (
        "sgx_tee_type",
        lambda p, o: Case(_patch(tp.build_quote(p), 4, "<I", 0), None, [p.root]),
        UnsupportedError,
        "TEE type",
    ),
    (
        "unsupported_body_type",
        lambda p, o: Case(_patch(tp.build_quote(p, **V5), 48, "<H", 1), None, [p.root]),
        UnsupportedError,
        "body type",
    ),
    (
        "unsupported_cert_type",
        lambda p, o: Case(_patch(tp.build_quote(p), 636 + 128, "<H", 5), None, [p.root]),
        UnsupportedError,
        "certification data type",
    ),
    (
        "pck_expired",
        lambda p, o: Case(tp.build_quote(p), None, [p.root], now=tp.T0 + dt.timedelta(days=4000)),
        ChainError,
        "after",
    ),
    (
        "pck_not_yet_valid",
        lambda p, o: Case(tp.build_quote(p), None, [p.root], now=tp.T0 - dt.timedelta(days=1)),
        ChainError,
        "before",
    ),
    (
        "crls_missing",
        lambda p, o: Case(tp.build_quote(p), dataclasses.replace(tc.collateral(p), pck_crl=None), [p.root]),
        CollateralError,
        "CRL",
    ),
    (
        "pck_crl_wrong_issuer",
        lambda p, o: Case(
            tp.build_quote(p), dataclasses.replace(tc.collateral(p), pck_crl=tc.crl(o.ca, o.ca_key)), [p.root]
        ),
        ChainError,
        "CRL",
    ),
    (
        "fmspc_mismatch",
        lambda p, o: Case(tp.build_quote(p), tc.collateral(p, fmspc=b"\x11" * 6), [p.root]),
        CollateralError,
        "FMSPC",
    ),
    (
        "below_all_levels",
        lambda p, o: Case(tp.build_quote(p, tee_tcb_svn=bytes(16)), tc.collateral(p), [p.root]),
        CollateralError,
        "no matching TCB level",
    ),
    (
        "missing_module_identity",
        lambda p, o: Case(
            tp.build_quote(p, **{**V5, "tee_tcb_svn": bytes([6, 2, 4]) + bytes(13)}),
            tc.collateral(p),
            [p.root],
        ),
        CollateralError,
        "TDX_02",
    ),
    (
        "mr_signer_seam_mismatch",
        lambda p, o: Case(tp.build_quote(p, mr_signer_seam=b"\x01" * 48), tc.collateral(p), [p.root]),
        CollateralError,
        "MRSIGNERSEAM",
    ),
    (
        "quote_signature",
        lambda p, o: Case(_flip(tp.build_quote(p), 636), None, [p.root]),
        SignatureError,
        "quote signature",
    ),
    (
        "qe_report_signature",
        lambda p, o: Case(_flip(tp.build_quote(p), 636 + 134 + 384), None, [p.root]),
        SignatureError,
        "QE report signature",
    ),
]


@pytest.mark.parametrize(
    ("build", "error", "match"), [n[1:] for n in NEGATIVES], ids=[n[0] for n in NEGATIVES]
)
def test_negative(
    pki: tp.TestPki, other: tp.TestPki, build: Build, error: type[Exception], match: str
) -> None:
    case = build(pki, other)
    options = case.options if case.collateral is not None else VerifyOptions(use_collateral=False)
    with pytest.raises(error, match=match):
        verified = TdxVerifier(case.roots, options=options).verify(case.quote, case.now, case.collateral)
        validate(verified, case.policy or Policy(unsafe_allow_any_mrtd=True))


def test_revoked_intermediate_via_root_crl(pki: tp.TestPki) -> None:
    c = dataclasses.replace(
        tc.collateral(pki), root_crl=tc.crl(pki.root, pki.root_key, [pki.ca.serial_number])
    )
    with pytest.raises(RevokedError, match="Platform CA"):
        TdxVerifier([pki.root]).verify(tp.build_quote(pki), tp.NOW, c)


def test_unsafe_skip_crls(pki: tp.TestPki) -> None:
    c = dataclasses.replace(tc.collateral(pki), pck_crl=None, root_crl=None)
    v = TdxVerifier([pki.root], options=VerifyOptions(unsafe_skip_crls=True)).verify(
        tp.build_quote(pki), tp.NOW, c
    )
    assert not v.crls_checked and v.tcb is not None
