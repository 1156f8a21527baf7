"""A minimal DER reader for the vendor X.509 extensions that cryptography exposes only as raw bytes.

AMD's VCEK/VLEK extensions (small primitives), Intel's SGX PCK extensions (nested (OID, value)
pairs) and NVIDIA's DICE FWID extension (a SEQUENCE ending in a hash) all need the same few
steps: split definite-length TLVs, check a tag, decode an OID or INTEGER. One reader, one set of
bounds checks; every malformed input raises ParseError naming `what` was being read.
"""

from __future__ import annotations

from attestation.errors import ParseError

TAG_INTEGER = 0x02
TAG_OCTET_STRING = 0x04
TAG_OID = 0x06
TAG_ENUMERATED = 0x0A
TAG_IA5STRING = 0x16
TAG_SEQUENCE = 0x30
_MAX_LENGTH_OCTETS = 4  # no extension here comes near 4 GiB; more octets are a malformed length


def read_tlv(data: bytes, off: int, what: str) -> tuple[int, int, int]:
    """(tag, value start, value end) of the element at `off`; definite lengths only (DER)."""
    if off + 2 > len(data):
        raise ParseError(f"{what}: DER element truncated")
    tag, first = data[off], data[off + 1]
    off += 2
    if first < 0x80:
        length = first
    else:
        n = first & 0x7F
        if n == 0 or n > _MAX_LENGTH_OCTETS or off + n > len(data):
            raise ParseError(f"{what}: bad DER length")
        length = int.from_bytes(data[off : off + n], "big")
        off += n
    if off + length > len(data):
        raise ParseError(f"{what}: DER element runs past its container")
    return tag, off, off + length


def children(data: bytes, what: str) -> list[tuple[int, bytes]]:
    """The (tag, value) elements that fill `data` exactly (a constructed value's contents)."""
    out: list[tuple[int, bytes]] = []
    off = 0
    while off < len(data):
        tag, start, end = read_tlv(data, off, what)
        out.append((tag, data[start:end]))
        off = end
    return out


def single(data: bytes, tag: int, what: str) -> bytes:
    """The value of the one element with `tag` that fills `data` exactly."""
    got, start, end = read_tlv(data, 0, what)
    if got != tag:
        raise ParseError(f"{what}: expected DER tag {tag:#x}, got {got:#x}")
    if end != len(data):
        raise ParseError(f"{what}: DER length does not match the value")
    return data[start:end]


def integer(data: bytes, what: str) -> int:
    """A whole-`data` INTEGER (two's complement, as DER encodes it)."""
    content = single(data, TAG_INTEGER, what)
    if not content:
        raise ParseError(f"{what}: empty INTEGER")
    return int.from_bytes(content, "big", signed=True)


def unsigned(tag: int, content: bytes, what: str) -> int:
    """The content of an INTEGER or ENUMERATED element that must not be negative."""
    if tag not in (TAG_INTEGER, TAG_ENUMERATED) or not content or content[0] & 0x80:
        raise ParseError(f"{what}: expected a non-negative INTEGER")
    return int.from_bytes(content, "big")


def ia5(data: bytes, what: str) -> str:
    """A whole-`data` IA5String, as text."""
    try:
        return single(data, TAG_IA5STRING, what).decode("ascii")
    except UnicodeDecodeError as exc:
        raise ParseError(f"{what}: not ASCII") from exc


def oid(content: bytes, what: str) -> str:
    """Dotted form of an OBJECT IDENTIFIER's content octets."""
    if not content:
        raise ParseError(f"{what}: empty OID")
    if content[-1] & 0x80:
        raise ParseError(f"{what}: truncated OID")
    arcs: list[int] = []
    value = 0
    for b in content:
        value = (value << 7) | (b & 0x7F)
        if not b & 0x80:
            arcs.append(value)
            value = 0
    first = min(arcs[0] // 40, 2)
    return ".".join(str(a) for a in [first, arcs[0] - 40 * first, *arcs[1:]])
