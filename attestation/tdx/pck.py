"""Intel SGX PCK certificate extensions (OID 1.2.840.113741.1.13.1), read with a minimal DER reader.

Intel SGX PCK Certificate and CRL Profile, section "SGX Extensions": a SEQUENCE of
(OID, value) pairs carrying PPID, TCB (16 CPUSVN components, PCESVN, CPUSVN), PCE-ID, FMSPC and
SGX Type. cryptography exposes the extension only as raw bytes, so it is decoded here.
"""

from __future__ import annotations

from dataclasses import dataclass

from cryptography import x509

from attestation.errors import ParseError

SGX_EXTENSIONS_OID = x509.ObjectIdentifier("1.2.840.113741.1.13.1")
_P = "1.2.840.113741.1.13.1"
_TAG_INTEGER, _TAG_OCTETS, _TAG_OID, _TAG_ENUM, _TAG_SEQ = 0x02, 0x04, 0x06, 0x0A, 0x30


@dataclass(frozen=True)
class PckExtensions:
    ppid: bytes
    cpusvn_components: tuple[int, ...]  # 16 SGX TCB component SVNs, compared with tcbInfo levels
    pcesvn: int
    cpusvn: bytes
    pceid: bytes
    fmspc: bytes
    sgx_type: int | None


def _tlv(data: bytes, off: int) -> tuple[int, int, int]:
    """(tag, value start, value end) of the element at `off`; definite lengths only (DER)."""
    if off + 2 > len(data):
        raise ParseError("DER element truncated")
    tag, first = data[off], data[off + 1]
    off += 2
    if first < 0x80:
        length = first
    else:
        n = first & 0x7F
        if n == 0 or n > 4 or off + n > len(data):
            raise ParseError("bad DER length")
        length = int.from_bytes(data[off : off + n], "big")
        off += n
    if off + length > len(data):
        raise ParseError("DER element runs past its container")
    return tag, off, off + length


def _children(data: bytes) -> list[tuple[int, bytes]]:
    out, off = [], 0
    while off < len(data):
        tag, start, end = _tlv(data, off)
        out.append((tag, data[start:end]))
        off = end
    return out


def _oid(raw: bytes) -> str:
    if not raw:
        raise ParseError("empty OID")
    arcs: list[int] = []
    value = 0
    for b in raw:
        value = (value << 7) | (b & 0x7F)
        if not b & 0x80:
            arcs.append(value)
            value = 0
    if raw[-1] & 0x80:
        raise ParseError("truncated OID")
    first = min(arcs[0] // 40, 2)
    return ".".join(str(a) for a in [first, arcs[0] - 40 * first, *arcs[1:]])


def _int(tag: int, raw: bytes, what: str) -> int:
    if tag not in (_TAG_INTEGER, _TAG_ENUM) or not raw or raw[0] & 0x80:
        raise ParseError(f"SGX extension {what}: expected a non-negative INTEGER")
    return int.from_bytes(raw, "big")


def _pairs(raw: bytes, what: str) -> dict[str, tuple[int, bytes]]:
    out: dict[str, tuple[int, bytes]] = {}
    for tag, seq in _children(raw):
        items = _children(seq) if tag == _TAG_SEQ else []
        if len(items) != 2 or items[0][0] != _TAG_OID:
            raise ParseError(f"SGX extension {what}: malformed (OID, value) pair")
        oid = _oid(items[0][1])
        if oid in out:
            raise ParseError(f"SGX extension {what}: duplicate {oid}")
        out[oid] = items[1]
    return out


def parse_sgx_extensions(value: bytes) -> PckExtensions:
    """Decode the DER value of the SGX extensions (the extension's OCTET STRING contents)."""
    tag, start, end = _tlv(value, 0)
    if tag != _TAG_SEQ or end != len(value):
        raise ParseError("SGX extensions: not a single SEQUENCE")
    top = _pairs(value[start:end], "top level")

    def need(arc: str, tag: int, size: int | None = None) -> bytes:
        if f"{_P}.{arc}" not in top:
            raise ParseError(f"SGX extensions: missing {_P}.{arc}")
        got_tag, raw = top[f"{_P}.{arc}"]
        if got_tag != tag or (size is not None and len(raw) != size):
            raise ParseError(f"SGX extensions: {_P}.{arc} has the wrong type or size")
        return raw

    tcb = _pairs(need("2", _TAG_SEQ), "TCB")
    comps = []
    for i in range(1, 17):
        if f"{_P}.2.{i}" not in tcb:
            raise ParseError(f"SGX extensions: TCB component {i} missing")
        comps.append(_int(*tcb[f"{_P}.2.{i}"], what=f"TCB component {i}"))
    if f"{_P}.2.17" not in tcb or f"{_P}.2.18" not in tcb:
        raise ParseError("SGX extensions: PCESVN or CPUSVN missing")
    cpusvn_tag, cpusvn = tcb[f"{_P}.2.18"]
    if cpusvn_tag != _TAG_OCTETS or len(cpusvn) != 16:
        raise ParseError("SGX extensions: CPUSVN must be 16 octets")
    sgx_type = _int(*top[f"{_P}.5"], what="SGX type") if f"{_P}.5" in top else None
    return PckExtensions(
        ppid=need("1", _TAG_OCTETS, 16),
        cpusvn_components=tuple(comps),
        pcesvn=_int(*tcb[f"{_P}.2.17"], what="PCESVN"),
        cpusvn=cpusvn,
        pceid=need("3", _TAG_OCTETS, 2),
        fmspc=need("4", _TAG_OCTETS, 6),
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
