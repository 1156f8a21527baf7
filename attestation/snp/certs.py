"""VCEK/VLEK certificates: the AMD KDS X.509 extensions (1.3.6.1.4.1.3704.1.*) and chain material.

See AMD "Versioned Chip Endorsement Key (VCEK) Certificate and KDS Interface Specification" (#57230)
for the extension table; the values are small DER primitives, read with attestation.der.
"""

from __future__ import annotations

import enum
import warnings
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID

from attestation import der
from attestation.errors import ChainError, ParseError
from attestation.snp.tcb import Product, TcbVersion, product_from_name
from attestation.x509chain import BAD_DER, load_der_or_pem, load_pem_chain

AMD_OID = "1.3.6.1.4.1.3704.1"
OID_STRUCT_VERSION = f"{AMD_OID}.1"
OID_PRODUCT_NAME = f"{AMD_OID}.2"
OID_BL_SPL = f"{AMD_OID}.3.1"
OID_TEE_SPL = f"{AMD_OID}.3.2"
OID_SNP_SPL = f"{AMD_OID}.3.3"
OID_UCODE_SPL = f"{AMD_OID}.3.8"
OID_FMC_SPL = f"{AMD_OID}.3.9"  # Turin only
OID_HWID = f"{AMD_OID}.4"
OID_CSP_ID = f"{AMD_OID}.5"  # VLEK only



class VekKind(enum.StrEnum):
    VCEK = "vcek"
    VLEK = "vlek"

    @property
    def roots_file(self) -> str:
        return "ask_ark" if self is VekKind.VCEK else "vlek_asvk_ark"


def _hwid(value: bytes) -> bytes:
    """hwID is 64 bytes (8 on Turin), raw in older certificates, OCTET STRING-wrapped in newer ones."""
    for n in (64, 8):
        if len(value) == n + 2 and value[0] == der.TAG_OCTET_STRING and value[1] == n:
            return value[2:]
    if len(value) in (64, 8):
        return value
    raise ParseError(f"hwID extension has unexpected length {len(value)}")


@dataclass(frozen=True)
class VekInfo:
    """A parsed VCEK or VLEK: what it claims about the chip and the TCB it was issued for."""

    cert: x509.Certificate
    kind: VekKind
    product: Product
    product_name: str
    struct_version: int
    tcb: TcbVersion
    hwid: bytes | None
    csp_id: str | None
    public_key: ec.EllipticCurvePublicKey


def _ext_values(cert: x509.Certificate) -> dict[str, bytes]:
    out: dict[str, bytes] = {}
    for ext in cert.extensions:
        if ext.oid.dotted_string.startswith(AMD_OID + ".") and isinstance(
            ext.value, x509.UnrecognizedExtension
        ):
            out[ext.oid.dotted_string] = ext.value.value
    return out


def _common_name(name: x509.Name) -> str:
    attrs = name.get_attributes_for_oid(NameOID.COMMON_NAME)
    return str(attrs[0].value) if attrs else ""


def parse_vek(cert_or_bytes: x509.Certificate | bytes) -> VekInfo:
    """Read a VCEK/VLEK and its AMD extensions; raises ParseError or ChainError."""
    cert = cert_or_bytes if isinstance(cert_or_bytes, x509.Certificate) else load_der_or_pem(cert_or_bytes)
    try:
        return _parse_vek(cert)
    except BAD_DER as exc:  # cryptography parses some fields lazily, on first access
        raise ParseError(f"malformed VEK certificate: {exc}") from exc


def _parse_vek(cert: x509.Certificate) -> VekInfo:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # AMD KDS issues serial 0, which cryptography warns about
        exts = _ext_values(cert)
    cn = _common_name(cert.subject)
    if cn == "SEV-VCEK" or (not cn and OID_HWID in exts):
        kind = VekKind.VCEK
    elif cn == "SEV-VLEK" or (not cn and OID_CSP_ID in exts):
        kind = VekKind.VLEK
    else:
        raise ChainError(f"certificate {cn!r} is neither a VCEK nor a VLEK")
    missing = [
        o for o in (OID_PRODUCT_NAME, OID_BL_SPL, OID_TEE_SPL, OID_SNP_SPL, OID_UCODE_SPL) if o not in exts
    ]
    if missing:
        raise ParseError(f"{kind.value.upper()} lacks AMD extensions {missing}")
    name = der.ia5(exts[OID_PRODUCT_NAME], "productName")
    product = product_from_name(name)
    spl = {oid: der.integer(exts[oid], oid) for oid in (OID_BL_SPL, OID_TEE_SPL, OID_SNP_SPL, OID_UCODE_SPL)}
    fmc: int | None = None
    if product.fmc_layout:
        if OID_FMC_SPL not in exts:
            raise ParseError("Turin VEK lacks the fmcSPL extension")
        fmc = der.integer(exts[OID_FMC_SPL], "fmcSPL")
    if any(not 0 <= v <= 255 for v in [*spl.values(), fmc or 0]):
        raise ParseError("VEK SPL extension out of range 0-255")
    tcb = TcbVersion(
        bl=spl[OID_BL_SPL], tee=spl[OID_TEE_SPL], snp=spl[OID_SNP_SPL], ucode=spl[OID_UCODE_SPL], fmc=fmc
    )
    hwid = _hwid(exts[OID_HWID]) if OID_HWID in exts else None
    if kind is VekKind.VCEK and hwid is None:
        raise ParseError("VCEK lacks the hwID extension")
    csp = der.ia5(exts[OID_CSP_ID], "csp_id") if OID_CSP_ID in exts else None
    key = cert.public_key()
    if not isinstance(key, ec.EllipticCurvePublicKey) or not isinstance(key.curve, ec.SECP384R1):
        raise ChainError(f"{kind.value.upper()} key must be ECDSA P-384")
    struct_version = (
        der.integer(exts[OID_STRUCT_VERSION], "structVersion") if OID_STRUCT_VERSION in exts else 0
    )
    return VekInfo(cert, kind, product, name, struct_version, tcb, hwid, csp, key)


@dataclass(frozen=True)
class AmdChainCerts:
    """Certificates sorted by role, whatever order or encoding they arrived in."""

    veks: tuple[x509.Certificate, ...] = ()
    intermediates: tuple[x509.Certificate, ...] = ()  # ASK or ASVK
    arks: tuple[x509.Certificate, ...] = ()


def classify_certs(blobs: list[bytes]) -> AmdChainCerts:
    """Sort DER/PEM blobs (a PEM may hold several certificates) into VEKs, ASK/ASVKs and ARKs."""
    veks: list[x509.Certificate] = []
    mids: list[x509.Certificate] = []
    arks: list[x509.Certificate] = []
    for blob in blobs:
        certs = load_pem_chain(blob) if blob.lstrip().startswith(b"-----BEGIN") else [load_der_or_pem(blob)]
        for cert in certs:
            key = cert.public_key()
            if isinstance(key, ec.EllipticCurvePublicKey):
                veks.append(cert)
            elif isinstance(key, rsa.RSAPublicKey) and _common_name(cert.subject).startswith("ARK-"):
                arks.append(cert)
            elif isinstance(key, rsa.RSAPublicKey):
                mids.append(cert)
            else:
                raise ParseError(f"unexpected certificate {cert.subject.rfc4514_string()}")
    return AmdChainCerts(tuple(veks), tuple(mids), tuple(arks))
