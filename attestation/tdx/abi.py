"""Intel TDX quote v4/v5 layout, parsed at fixed offsets with every length field checked.

Layout: Intel TDX DCAP Quote Generation Library and Quote Verification Library (ECDSA quote
format, "Intel TDX DCAP Quoting Library API" appendix A: Quote Format v4, and the v5 extension
with a typed body), as found in DCAP's sgx_quote_4.h / sgx_quote_5.h. All integers are
little-endian; ECDSA keys and signatures are big-endian r||s, x||y.

Trailing bytes after the signature data are tolerated (and reported) because real quotes carry
them; everything inside the declared lengths must match exactly.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding

from attestation.errors import ParseError, UnsupportedError
from attestation.x509chain import load_pem_chain

HEADER_SIZE = 48
TD_REPORT10_SIZE = 584  # TDX 1.0 TD quote body
TD_REPORT15_SIZE = 648  # TDX 1.5: + tee_tcb_svn2 (16) + mr_servicetd (48)
QE_REPORT_SIZE = 384  # SGX REPORT body
SIG_SIZE = 64
KEY_SIZE = 64
ATT_KEY_ECDSA_P256 = 2
TEE_TYPE_TDX = 0x00000081
INTEL_QE_VENDOR_ID = bytes.fromhex("939a7233f79c4ca9940a0db3957f0607")
CERT_TYPE_PCK_CHAIN = 5
CERT_TYPE_QE_REPORT = 6
BODY_TYPE_TDX10 = 2
BODY_TYPE_TDX15 = 3
_BODY_SIZES = {BODY_TYPE_TDX10: TD_REPORT10_SIZE, BODY_TYPE_TDX15: TD_REPORT15_SIZE}


@dataclass(frozen=True)
class QuoteHeader:
    version: int
    att_key_type: int
    tee_type: int
    reserved: bytes  # bytes 8..12 (go-tdx-guest: pce_svn, qe_svn); not interpreted
    qe_vendor_id: bytes
    user_data: bytes


@dataclass(frozen=True)
class TdQuoteBody:
    tee_tcb_svn: bytes
    mr_seam: bytes
    mr_signer_seam: bytes
    seam_attributes: bytes
    td_attributes: bytes
    xfam: bytes
    mr_td: bytes
    mr_config_id: bytes
    mr_owner: bytes
    mr_owner_config: bytes
    rtmrs: tuple[bytes, bytes, bytes, bytes]
    report_data: bytes
    tee_tcb_svn2: bytes | None = None  # TDX 1.5 bodies only
    mr_servicetd: bytes | None = None

    @property
    def debug(self) -> bool:
        # TDATTRIBUTES bit 0 (TUD.DEBUG): the host VMM can read and write TD memory.
        return bool(self.td_attributes[0] & 1)

    @property
    def migratable(self) -> bool:
        # TDATTRIBUTES bit 29 (MIGRATABLE): a migration TD may export this TD's state.
        return bool(int.from_bytes(self.td_attributes, "little") >> 29 & 1)


@dataclass(frozen=True)
class QeReport:
    raw: bytes  # the 384 signed bytes
    cpu_svn: bytes
    miscselect: int
    attributes: bytes
    mr_enclave: bytes
    mr_signer: bytes
    isv_prod_id: int
    isv_svn: int
    report_data: bytes


@dataclass(frozen=True)
class SignatureData:
    quote_signature: bytes  # r||s over the header and body
    attestation_key: bytes  # x||y, P-256
    qe_report: QeReport
    qe_report_signature: bytes  # r||s by the PCK leaf over qe_report.raw
    qe_auth_data: bytes
    pck_chain_pem: bytes
    pck_chain: tuple[x509.Certificate, ...]  # leaf, intermediate CA, root as carried in the quote


@dataclass(frozen=True)
class Quote:
    header: QuoteHeader
    body_type: int  # v4 quotes: always 2 (TDX 1.0 body)
    body: TdQuoteBody
    signed: bytes  # header || [v5 body descriptor] || body: what the attestation key signs
    signature: SignatureData
    size: int  # bytes consumed by the declared lengths
    trailing: int  # bytes after the signature data, ignored


def _u16(data: bytes, off: int) -> int:
    return int(struct.unpack_from("<H", data, off)[0])


def _u32(data: bytes, off: int) -> int:
    return int(struct.unpack_from("<I", data, off)[0])


def _need(data: bytes, end: int, what: str) -> None:
    if len(data) < end:
        raise ParseError(f"quote truncated in {what}: need {end} bytes, have {len(data)}")


def parse_header(data: bytes) -> QuoteHeader:
    # Spec step H1-H4 (Quote Format, "Quote Header"): version, attestation key type, TEE type, QE vendor.
    _need(data, HEADER_SIZE, "header")
    version = _u16(data, 0)
    if version not in (4, 5):
        raise UnsupportedError(f"quote format not supported: version {version}")
    att_key_type = _u16(data, 2)
    if att_key_type != ATT_KEY_ECDSA_P256:
        raise UnsupportedError(f"attestation key type {att_key_type} not supported (want ECDSA P-256)")
    tee_type = _u32(data, 4)
    if tee_type != TEE_TYPE_TDX:
        raise UnsupportedError(f"TEE type {tee_type:#x} is not TDX (0x81)")
    vendor = data[12:28]
    if vendor != INTEL_QE_VENDOR_ID:
        raise UnsupportedError(f"QE vendor id {vendor.hex()} is not Intel's")
    return QuoteHeader(version, att_key_type, tee_type, data[8:12], vendor, data[28:48])


def parse_td_body(raw: bytes) -> TdQuoteBody:
    if len(raw) not in (TD_REPORT10_SIZE, TD_REPORT15_SIZE):
        raise ParseError(f"TD quote body must be 584 or 648 bytes, got {len(raw)}")
    f = [raw[a:b] for a, b in _BODY_FIELDS]
    extra = {}
    if len(raw) == TD_REPORT15_SIZE:
        extra = {"tee_tcb_svn2": raw[584:600], "mr_servicetd": raw[600:648]}
    return TdQuoteBody(*f[:10], (f[10], f[11], f[12], f[13]), f[14], **extra)  # type: ignore[arg-type, call-arg]


def _spans(sizes: list[int]) -> list[tuple[int, int]]:
    out, off = [], 0
    for size in sizes:
        out.append((off, off + size))
        off += size
    return out


# tee_tcb_svn, mr_seam, mr_signer_seam, seam_attributes, td_attributes, xfam, mr_td, mr_config_id,
# mr_owner, mr_owner_config, rtmr0..3, report_data
_BODY_FIELDS = _spans([16, 48, 48, 8, 8, 8, 48, 48, 48, 48, 48, 48, 48, 48, 64])


def parse_qe_report(raw: bytes) -> QeReport:
    if len(raw) != QE_REPORT_SIZE:
        raise ParseError(f"QE report must be {QE_REPORT_SIZE} bytes")
    return QeReport(
        raw=raw,
        cpu_svn=raw[0:16],
        miscselect=_u32(raw, 16),
        attributes=raw[48:64],
        mr_enclave=raw[64:96],
        mr_signer=raw[128:160],
        isv_prod_id=_u16(raw, 256),
        isv_svn=_u16(raw, 258),
        report_data=raw[320:384],
    )


def _parse_qe_cert_data(cd: bytes) -> tuple[QeReport, bytes, bytes, bytes]:
    # Spec: "QE Report Certification Data" (certification data type 6): QE report, its signature,
    # QE authentication data, then nested certification data that must be the PCK chain (type 5).
    fixed = QE_REPORT_SIZE + SIG_SIZE
    if len(cd) < fixed + 2:
        raise ParseError("QE report certification data truncated")
    qe_report = parse_qe_report(cd[:QE_REPORT_SIZE])
    qe_sig = cd[QE_REPORT_SIZE:fixed]
    auth_len = _u16(cd, fixed)
    off = fixed + 2
    if len(cd) < off + auth_len + 6:
        raise ParseError(f"QE auth data length {auth_len} runs past the certification data")
    auth = cd[off : off + auth_len]
    off += auth_len
    inner_type, inner_size = _u16(cd, off), _u32(cd, off + 2)
    off += 6
    if inner_type != CERT_TYPE_PCK_CHAIN:
        raise UnsupportedError(f"inner certification data type {inner_type} (want 5, PCK chain)")
    if off + inner_size != len(cd):
        raise ParseError(
            f"PCK chain size {inner_size:#x} does not fill the QE certification data "
            f"({len(cd) - off:#x} bytes left)"
        )
    return qe_report, qe_sig, auth, cd[off:]


def _parse_pck_chain(pem: bytes) -> tuple[x509.Certificate, ...]:
    # Only the canonical PEM encoding (64-column base64, "\n" line ends, optionally one NUL, as
    # Intel's QE writes it) is accepted: then every byte of the chain is covered by a certificate
    # signature or the pinned-root comparison, and no byte of the quote is unauthenticated.
    if not pem.startswith(b"-----BEGIN CERTIFICATE-----"):
        raise ParseError("PCK certification data is not a PEM certificate chain")
    certs = load_pem_chain(pem)  # every field decoded: a damaged certificate is a ParseError here
    if len(certs) != 3:
        raise ParseError(f"PCK chain must hold leaf, intermediate and root; got {len(certs)} certificates")
    canonical = b"".join(c.public_bytes(Encoding.PEM) for c in certs)
    if pem not in (canonical, canonical + b"\0"):
        raise ParseError("PCK certificate chain PEM is not in canonical form")
    return tuple(certs)


def parse_signature_data(sd: bytes) -> SignatureData:
    # Spec: "ECDSA 256-bit Quote Signature Data Structure (v4)": signature, attestation key,
    # certification data (type, size, data). The size must fill the declared signature data exactly.
    head = SIG_SIZE + KEY_SIZE + 6
    if len(sd) < head:
        raise ParseError("signature data truncated")
    cert_type, cert_size = _u16(sd, 128), _u32(sd, 130)
    if head + cert_size != len(sd):
        raise ParseError(f"size of certificate data is {len(sd) - head:#x}. Expected size {cert_size:#x}")
    if cert_type != CERT_TYPE_QE_REPORT:
        raise UnsupportedError(f"certification data type {cert_type} not supported (want 6)")
    qe_report, qe_sig, auth, pem = _parse_qe_cert_data(sd[head:])
    return SignatureData(sd[0:64], sd[64:128], qe_report, qe_sig, auth, pem, _parse_pck_chain(pem))


def parse_quote(data: bytes) -> Quote:
    """Parse a TDX quote v4 or v5. Raises ParseError / UnsupportedError; never reads past lengths."""
    data = bytes(data)
    header = parse_header(data)
    if header.version == 4:
        body_type, body_off, body_size = BODY_TYPE_TDX10, HEADER_SIZE, TD_REPORT10_SIZE
    else:
        # v5 adds a body descriptor (type u16, size u32) so SGX/TDX 1.0/TDX 1.5 bodies share a format.
        _need(data, HEADER_SIZE + 6, "v5 body descriptor")
        body_type, body_size = _u16(data, HEADER_SIZE), _u32(data, HEADER_SIZE + 2)
        if body_type not in _BODY_SIZES:
            raise UnsupportedError(f"quote v5 body type {body_type} not supported (want 2 or 3)")
        if body_size != _BODY_SIZES[body_type]:
            raise ParseError(f"quote v5 body type {body_type} must be {_BODY_SIZES[body_type]} bytes")
        body_off = HEADER_SIZE + 6
    signed_end = body_off + body_size
    _need(data, signed_end + 4, "body")
    sig_len = _u32(data, signed_end)
    end = signed_end + 4 + sig_len
    _need(data, end, "signature data")
    signature = parse_signature_data(data[signed_end + 4 : end])
    body = parse_td_body(data[body_off:signed_end])
    return Quote(header, body_type, body, data[:signed_end], signature, end, len(data) - end)
