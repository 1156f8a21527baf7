"""A test Intel PKI and TDX evidence in the real formats, signed with throwaway keys.

For tests, benchmarks and the simulated TEE only: every key here is generated at run time, and
the root is trusted only when a caller injects it. Names mimic Intel's so the verifier's name
checks (PCK Platform CA, TCB Signing) are exercised as with real evidence.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, utils
from cryptography.x509.oid import NameOID

from attestation.tdx import abi
from attestation.tdx.pck import SGX_EXTENSIONS_OID
from attestation.tdx.verify import Collateral

T0 = dt.datetime(2025, 1, 1, tzinfo=dt.UTC)
NOW = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
QE_MRSIGNER = hashlib.sha256(b"test TD_QE signer").digest()
FMSPC = bytes.fromhex("00906ed50000")
SGX_COMPS = (4, 4, 2, 2, 4, 1, 0, 5) + (0,) * 8
_P = "1.2.840.113741.1.13.1"


def _name(cn: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.COMMON_NAME, cn),
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Intel Corporation"),
            x509.NameAttribute(NameOID.LOCALITY_NAME, "Santa Clara"),
            x509.NameAttribute(NameOID.STATE_OR_PROVINCE_NAME, "CA"),
            x509.NameAttribute(NameOID.COUNTRY_NAME, "US"),
        ]
    )


def _der(tag: int, content: bytes) -> bytes:
    n = len(content)
    length = (
        bytes([n])
        if n < 0x80
        else bytes([0x80 | ((n.bit_length() + 7) // 8)]) + n.to_bytes((n.bit_length() + 7) // 8, "big")
    )
    return bytes([tag]) + length + content


def _oid(dotted: str) -> bytes:
    arcs = [int(a) for a in dotted.split(".")]
    out = bytearray([40 * arcs[0] + arcs[1]])
    for arc in arcs[2:]:
        chunk = [arc & 0x7F]
        while arc > 0x7F:
            arc >>= 7
            chunk.append(0x80 | (arc & 0x7F))
        out += bytes(reversed(chunk))
    return _der(0x06, bytes(out))


def _int(v: int, tag: int = 0x02) -> bytes:
    return _der(tag, v.to_bytes(v.bit_length() // 8 + 1, "big"))


def sgx_extension(fmspc: bytes, comps: Sequence[int], pcesvn: int, pceid: bytes = b"\0\0") -> bytes:
    """DER value of the SGX extensions (PCK Certificate and CRL Profile) with the given TCB."""

    def pair(arc: str, value: bytes) -> bytes:
        return _der(0x30, _oid(f"{_P}.{arc}") + value)

    tcb = b"".join(pair(f"2.{i + 1}", _int(c)) for i, c in enumerate(comps))
    tcb += pair("2.17", _int(pcesvn)) + pair("2.18", _der(0x04, bytes(comps)))
    body = pair("1", _der(0x04, bytes(range(16)))) + pair("2", _der(0x30, tcb))
    body += pair("3", _der(0x04, pceid)) + pair("4", _der(0x04, fmspc)) + pair("5", _int(0, 0x0A))
    return _der(0x30, body)


@dataclass(frozen=True)
class TestPki:
    root_key: ec.EllipticCurvePrivateKey
    root: x509.Certificate
    ca_key: ec.EllipticCurvePrivateKey
    ca: x509.Certificate
    pck_key: ec.EllipticCurvePrivateKey
    pck: x509.Certificate
    tcb_key: ec.EllipticCurvePrivateKey
    tcb_signer: x509.Certificate

    def pck_chain_pem(self) -> bytes:
        return b"".join(c.public_bytes(serialization.Encoding.PEM) for c in (self.pck, self.ca, self.root))

    def signing_chain_pem(self) -> bytes:
        return b"".join(c.public_bytes(serialization.Encoding.PEM) for c in (self.tcb_signer, self.root))


def _cert(
    subject: str,
    key: ec.EllipticCurvePrivateKey,
    issuer: x509.Name,
    signer: ec.EllipticCurvePrivateKey,
    serial: int,
    ca: bool,
    not_before: dt.datetime,
    not_after: dt.datetime,
    ext: bytes | None = None,
) -> x509.Certificate:
    b = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(serial)
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if ext is not None:
        b = b.add_extension(x509.UnrecognizedExtension(SGX_EXTENSIONS_OID, ext), critical=False)
    return b.sign(signer, hashes.SHA256())


def make_pki(
    *,
    fmspc: bytes = FMSPC,
    comps: Sequence[int] = SGX_COMPS,
    pcesvn: int = 13,
    not_before: dt.datetime = T0,
    not_after: dt.datetime = T0 + dt.timedelta(days=3650),
    ca_name: str = "Intel SGX PCK Platform CA",
) -> TestPki:
    keys = [ec.generate_private_key(ec.SECP256R1()) for _ in range(4)]
    root_name = _name("Intel SGX Root CA")
    root = _cert("Intel SGX Root CA", keys[0], root_name, keys[0], 1, True, not_before, not_after)
    ca = _cert(ca_name, keys[1], root_name, keys[0], 2, True, not_before, not_after)
    leaf = _cert(
        "Intel SGX PCK Certificate",
        keys[2],
        ca.subject,
        keys[1],
        3,
        False,
        not_before,
        not_after,
        sgx_extension(fmspc, comps, pcesvn),
    )
    tcb = _cert("Intel SGX TCB Signing", keys[3], root_name, keys[0], 4, False, not_before, not_after)
    return TestPki(keys[0], root, keys[1], ca, keys[2], leaf, keys[3], tcb)


def _rs(key: ec.EllipticCurvePrivateKey, data: bytes) -> bytes:
    r, s = utils.decode_dss_signature(key.sign(data, ec.ECDSA(hashes.SHA256())))
    return r.to_bytes(32, "big") + s.to_bytes(32, "big")


BODY_DEFAULTS: dict[str, bytes] = {
    "tee_tcb_svn": bytes([3, 0, 5]) + bytes(13),
    "mr_seam": b"\x5e" * 48,
    "mr_signer_seam": bytes(48),
    "seam_attributes": bytes(8),
    "td_attributes": bytes.fromhex("0000001000000000"),
    "xfam": bytes.fromhex("e702060000000000"),
    "mr_td": b"\x7d" * 48,
    "mr_config_id": bytes(48),
    "mr_owner": bytes(48),
    "mr_owner_config": bytes(48),
    "rtmr0": b"\x10" * 48,
    "rtmr1": b"\x11" * 48,
    "rtmr2": b"\x12" * 48,
    "rtmr3": bytes(48),
    "report_data": bytes(64),
    "tee_tcb_svn2": bytes([3, 0, 5]) + bytes(13),
    "mr_servicetd": bytes(48),
}
_ORDER = list(BODY_DEFAULTS)


def build_quote(
    pki: TestPki,
    *,
    version: int = 4,
    body_type: int = 3,
    qe_isvsvn: int = 7,
    qe_mrsigner: bytes = QE_MRSIGNER,
    qe_auth: bytes = bytes(range(32)),
    trailing: bytes = b"",
    att_key: ec.EllipticCurvePrivateKey | None = None,
    bind: bool = True,
    **fields: bytes,
) -> bytes:
    """A quote v4 or v5 (body type 2 or 3) with `fields` overriding the TD body defaults."""
    vals = {**BODY_DEFAULTS, **fields}
    n = 15 if version == 4 or body_type == 2 else 17
    body = b"".join(vals[k] for k in _ORDER[:n])
    header = struct.pack("<HHI", version, 2, 0x81) + bytes(4) + abi.INTEL_QE_VENDOR_ID + b"\xab" * 20
    signed = header + (struct.pack("<HI", body_type, len(body)) if version == 5 else b"") + body
    key = att_key or ec.generate_private_key(ec.SECP256R1())
    pub = key.public_key().public_bytes(
        serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint
    )[1:]
    binding = hashlib.sha256(pub + qe_auth).digest() + bytes(32) if bind else bytes(64)
    qe = bytearray(384)
    qe[0:16] = bytes([4, 4, 25, 27]) + bytes(12)
    qe[48:64] = bytes.fromhex("1500000000000000e700000000000000")
    qe[64:96] = b"\x0e" * 32
    qe[128:160] = qe_mrsigner
    struct.pack_into("<HH", qe, 256, 2, qe_isvsvn)
    qe[320:384] = binding
    chain = pki.pck_chain_pem() + b"\0"
    inner = struct.pack("<H", len(qe_auth)) + qe_auth + struct.pack("<HI", 5, len(chain)) + chain
    cert_data = bytes(qe) + _rs(pki.pck_key, bytes(qe)) + inner
    sig_data = _rs(key, signed) + pub + struct.pack("<HI", 6, len(cert_data)) + cert_data
    return signed + struct.pack("<I", len(sig_data)) + sig_data + trailing


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
    return b'{"' + name.encode() + b'":' + body + b',"signature":"' + _rs(key, body).hex().encode() + b'"}'


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
