"""Intel SGX PCK certificate extensions (OID 1.2.840.113741.1.13.1), read with attestation.der.

Intel SGX PCK Certificate and CRL Profile, section "SGX Extensions": a SEQUENCE of
(OID, value) pairs carrying PPID, TCB (16 CPUSVN components, PCESVN, CPUSVN), PCE-ID, FMSPC and
SGX Type. cryptography exposes the extension only as raw bytes, so it is decoded here.
"""

from __future__ import annotations

from dataclasses import dataclass

from cryptography import x509

from attestation import der
from attestation.errors import ParseError

SGX_EXTENSIONS_OID = x509.ObjectIdentifier("1.2.840.113741.1.13.1")
_P = "1.2.840.113741.1.13.1"


@dataclass(frozen=True)
class PckExtensions:
    ppid: bytes
    cpusvn_components: tuple[int, ...]  # 16 SGX TCB component SVNs, compared with tcbInfo levels
    pcesvn: int
    cpusvn: bytes
    pceid: bytes
    fmspc: bytes
    sgx_type: int | None


def _pairs(raw: bytes, what: str) -> dict[str, tuple[int, bytes]]:
    out: dict[str, tuple[int, bytes]] = {}
    for tag, seq in der.children(raw, f"SGX extension {what}"):
        items = der.children(seq, f"SGX extension {what}") if tag == der.TAG_SEQUENCE else []
        if len(items) != 2 or items[0][0] != der.TAG_OID:
            raise ParseError(f"SGX extension {what}: malformed (OID, value) pair")
        oid = der.oid(items[0][1], f"SGX extension {what}")
        if oid in out:
            raise ParseError(f"SGX extension {what}: duplicate {oid}")
        out[oid] = items[1]
    return out


def parse_sgx_extensions(value: bytes) -> PckExtensions:
    """Decode the DER value of the SGX extensions (the extension's OCTET STRING contents)."""
    top = _pairs(der.single(value, der.TAG_SEQUENCE, "SGX extensions"), "top level")

    def need(arc: str, tag: int, size: int | None = None) -> bytes:
        if f"{_P}.{arc}" not in top:
            raise ParseError(f"SGX extensions: missing {_P}.{arc}")
        got_tag, raw = top[f"{_P}.{arc}"]
        if got_tag != tag or (size is not None and len(raw) != size):
            raise ParseError(f"SGX extensions: {_P}.{arc} has the wrong type or size")
        return raw

    tcb = _pairs(need("2", der.TAG_SEQUENCE), "TCB")
    comps = []
    for i in range(1, 17):
        if f"{_P}.2.{i}" not in tcb:
            raise ParseError(f"SGX extensions: TCB component {i} missing")
        comps.append(der.unsigned(*tcb[f"{_P}.2.{i}"], f"SGX extension TCB component {i}"))
    if f"{_P}.2.17" not in tcb or f"{_P}.2.18" not in tcb:
        raise ParseError("SGX extensions: PCESVN or CPUSVN missing")
    cpusvn_tag, cpusvn = tcb[f"{_P}.2.18"]
    if cpusvn_tag != der.TAG_OCTET_STRING or len(cpusvn) != 16:
        raise ParseError("SGX extensions: CPUSVN must be 16 octets")
    sgx_type = der.unsigned(*top[f"{_P}.5"], "SGX extension SGX type") if f"{_P}.5" in top else None
    return PckExtensions(
        ppid=need("1", der.TAG_OCTET_STRING, 16),
        cpusvn_components=tuple(comps),
        pcesvn=der.unsigned(*tcb[f"{_P}.2.17"], "SGX extension PCESVN"),
        cpusvn=cpusvn,
        pceid=need("3", der.TAG_OCTET_STRING, 2),
        fmspc=need("4", der.TAG_OCTET_STRING, 6),
        sgx_type=sgx_type,
    )


def pck_extensions(cert: x509.Certificate) -> PckExtensions:
    try:
        ext = cert.extensions.get_extension_for_oid(SGX_EXTENSIONS_OID)
    except x509.ExtensionNotFound as exc:
        raise ParseError("PCK certificate has no SGX extensions") from exc
    except ValueError as exc:
        raise ParseError(f"PCK certificate extensions unreadable: {exc}") from exc
    raw = ext.value.value if isinstance(ext.value, x509.UnrecognizedExtension) else b""
    return parse_sgx_extensions(raw)
