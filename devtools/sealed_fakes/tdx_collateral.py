"""Test Intel PCS collateral in the real formats: TDX tcbInfo v3, TD_QE identity v2, CRLs.

Signed with the throwaway TCB Signing / CA keys of a `testpki.TestPki`; tests and benchmarks only.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Sequence
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from attestation.tdx.verify import Collateral
from sealed_fakes.tdx_pki import FMSPC, NOW, QE_MRSIGNER, SGX_COMPS, TestPki, rs_sign


def _level(status: str, date: str, advisories: Sequence[str], **tcb: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"tcb": tcb, "tcbDate": date, "tcbStatus": status}
    if advisories:
        out["advisoryIDs"] = list(advisories)
    return out


def _comps(svns: Sequence[int]) -> list[dict[str, int]]:
    return [{"svn": s} for s in svns]


def default_tcb_levels() -> list[dict[str, Any]]:
    up = _level(
        "UpToDate",
        "2025-06-01T00:00:00Z",
        [],
        sgxtcbcomponents=_comps(SGX_COMPS),
        pcesvn=13,
        tdxtcbcomponents=_comps([3, 0, 4] + [0] * 13),
    )
    old = _level(
        "OutOfDate",
        "2024-01-01T00:00:00Z",
        ["INTEL-SA-00001"],
        sgxtcbcomponents=_comps((2, 2, 2, 2, 3, 1, 0, 3) + (0,) * 8),
        pcesvn=11,
        tdxtcbcomponents=_comps([2, 0, 2] + [0] * 13),
    )
    return [up, old]


def default_module_identities() -> list[dict[str, Any]]:
    levels = [
        _level("UpToDate", "2025-06-01T00:00:00Z", [], isvsvn=6),
        _level("OutOfDate", "2024-01-01T00:00:00Z", ["INTEL-SA-00002"], isvsvn=2),
    ]
    return [
        {
            "id": "TDX_01",
            "mrsigner": "00" * 48,
            "attributes": "00" * 8,
            "attributesMask": "FF" * 8,
            "tcbLevels": levels,
        }
    ]


def _signed(key: ec.EllipticCurvePrivateKey, name: str, inner: dict[str, Any]) -> bytes:
    body = json.dumps(inner, separators=(",", ":")).encode()
    return (
        b'{"' + name.encode() + b'":' + body + b',"signature":"' + rs_sign(key, body).hex().encode() + b'"}'
    )


def _ts(t: dt.datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def tcb_info(
    pki: TestPki,
    *,
    issue: dt.datetime = NOW - dt.timedelta(days=10),
    days: int = 30,
    fmspc: bytes = FMSPC,
    levels: list[dict[str, Any]] | None = None,
    identities: list[dict[str, Any]] | None = None,
    **overrides: Any,
) -> bytes:
    inner: dict[str, Any] = {
        "id": "TDX",
        "version": 3,
        "issueDate": _ts(issue),
        "nextUpdate": _ts(issue + dt.timedelta(days=days)),
        "fmspc": fmspc.hex(),
        "pceId": "0000",
        "tcbType": 0,
        "tcbEvaluationDataNumber": 18,
        "tdxModule": {"mrsigner": "00" * 48, "attributes": "00" * 8, "attributesMask": "FF" * 8},
        "tdxModuleIdentities": default_module_identities() if identities is None else identities,
        "tcbLevels": default_tcb_levels() if levels is None else levels,
    }
    return _signed(pki.tcb_key, "tcbInfo", {**inner, **overrides})


def qe_identity(
    pki: TestPki,
    *,
    issue: dt.datetime = NOW - dt.timedelta(days=10),
    days: int = 30,
    mrsigner: bytes = QE_MRSIGNER,
    **overrides: Any,
) -> bytes:
    levels = [
        _level("UpToDate", "2025-06-01T00:00:00Z", [], isvsvn=7),
        _level("OutOfDate", "2024-01-01T00:00:00Z", ["INTEL-SA-00003"], isvsvn=4),
    ]
    inner: dict[str, Any] = {
        "id": "TD_QE",
        "version": 2,
        "issueDate": _ts(issue),
        "nextUpdate": _ts(issue + dt.timedelta(days=days)),
        "tcbEvaluationDataNumber": 18,
        "miscselect": "00000000",
        "miscselectMask": "FFFFFFFF",
        "attributes": "11" + "00" * 15,
        "attributesMask": "FBFFFFFFFFFFFFFF" + "00" * 8,
        "mrsigner": mrsigner.hex().upper(),
        "isvprodid": 2,
        "tcbLevels": levels,
    }
    return _signed(pki.tcb_key, "enclaveIdentity", {**inner, **overrides})


def crl(
    issuer: x509.Certificate,
    key: ec.EllipticCurvePrivateKey,
    revoked: Sequence[int] = (),
    issue: dt.datetime = NOW - dt.timedelta(days=10),
    days: int = 30,
) -> bytes:
    b = x509.CertificateRevocationListBuilder().issuer_name(issuer.subject)
    b = b.last_update(issue).next_update(issue + dt.timedelta(days=days))
    for serial in revoked:
        b = b.add_revoked_certificate(
            x509.RevokedCertificateBuilder().serial_number(serial).revocation_date(issue).build()
        )
    return b.sign(key, hashes.SHA256()).public_bytes(serialization.Encoding.DER)


def collateral(pki: TestPki, *, revoked_pck: bool = False, **kw: Any) -> Collateral:
    return Collateral(
        tcb_info=tcb_info(pki, **kw),
        qe_identity=qe_identity(pki),
        signing_chain=pki.signing_chain_pem(),
        pck_crl=crl(pki.ca, pki.ca_key, [pki.pck.serial_number] if revoked_pck else []),
        root_crl=crl(pki.root, pki.root_key),
    )
