"""A test Intel PKI and TDX evidence in the real formats, signed with throwaway keys.

For tests, benchmarks and the simulated TEE only: every key here is generated at run time, and
the root is trusted only when a caller injects it. Names mimic Intel's so the verifier's name
checks (PCK Platform CA, TCB Signing) are exercised as with real evidence.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import struct
from collections.abc import Sequence
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, utils
from cryptography.x509.oid import NameOID

from attestation.tdx import abi
from attestation.tdx.pck import SGX_EXTENSIONS_OID

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


def rs_sign(key: ec.EllipticCurvePrivateKey, data: bytes) -> bytes:
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
    cert_data = bytes(qe) + rs_sign(pki.pck_key, bytes(qe)) + inner
    sig_data = rs_sign(key, signed) + pub + struct.pack("<HI", 6, len(cert_data)) + cert_data
    return signed + struct.pack("<I", len(sig_data)) + sig_data + trailing
