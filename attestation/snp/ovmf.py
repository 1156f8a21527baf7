"""OVMF firmware as the SEV-SNP launch sees it: the GUIDed footer table and the SEV metadata sections.

The table sits just before the last 32 bytes of the image (edk2 `OvmfPkg/ResetVector`); entries are
read backwards from the footer entry, each `data ‖ u16 size ‖ GUID(16, little-endian)`. The SEV
metadata (`ASEV`, version 1) lists the pages QEMU adds to the launch besides the image itself.
Malformed input raises `ParseError`; nothing here trusts a length it has not bounded.
"""

from __future__ import annotations

import enum
import struct
import uuid
from dataclasses import dataclass
from pathlib import Path

from attestation.errors import ParseError

FOUR_GIB = 1 << 32
FOOTER_TABLE_GUID = uuid.UUID("96b582de-1fb2-45f7-baea-a366c55a082d")
SEV_HASH_TABLE_RV_GUID = uuid.UUID("7255371f-3a3b-4b04-927b-1da6efa8d454")
SEV_ES_RESET_BLOCK_GUID = uuid.UUID("00f771de-1a7e-4fcb-890e-68c77e2fb44e")
SEV_METADATA_GUID = uuid.UUID("dc886566-984a-4798-a75e-5585a7bf67cc")
_ENTRY_HEADER = struct.Struct("<H16s")  # size (including this header), GUID
_METADATA_HEADER = struct.Struct("<4sIII")  # signature, size, version, number of items
_SECTION = struct.Struct("<III")  # gpa, size, type


class SectionType(enum.IntEnum):
    """OvmfSevMetadata.asm section kinds."""

    SNP_SEC_MEM = 1
    SNP_SECRETS = 2
    CPUID = 3
    SVSM_CAA = 4
    SNP_KERNEL_HASHES = 0x10


@dataclass(frozen=True)
class MetadataSection:
    gpa: int
    size: int
    kind: SectionType


@dataclass(frozen=True)
class Ovmf:
    data: bytes
    table: dict[uuid.UUID, bytes]
    sections: tuple[MetadataSection, ...]

    @property
    def gpa(self) -> int:
        """The image is mapped so that it ends at 4 GiB."""
        return FOUR_GIB - len(self.data)

    def _u32_entry(self, guid: uuid.UUID, what: str) -> int:
        entry = self.table.get(guid)
        if entry is None or len(entry) < 4:
            raise ParseError(f"OVMF footer table has no {what} entry")
        return int.from_bytes(entry[:4], "little")

    def sev_es_reset_eip(self) -> int:
        return self._u32_entry(SEV_ES_RESET_BLOCK_GUID, "SEV-ES reset block")

    def sev_hashes_table_gpa(self) -> int:
        return self._u32_entry(SEV_HASH_TABLE_RV_GUID, "SEV hash table")

    def has_section(self, kind: SectionType) -> bool:
        return any(s.kind is kind for s in self.sections)


def _footer_table(data: bytes) -> dict[uuid.UUID, bytes]:
    footer_at = len(data) - 32 - _ENTRY_HEADER.size
    if footer_at < 0:
        raise ParseError(f"OVMF image of {len(data)} bytes is too small for a footer table")
    size, guid = _ENTRY_HEADER.unpack_from(data, footer_at)
    if uuid.UUID(bytes_le=guid) != FOOTER_TABLE_GUID:
        return {}  # an OVMF build without the table (no SEV support): no entries
    table_size = size - _ENTRY_HEADER.size
    if table_size < 0 or table_size > footer_at:
        raise ParseError(f"OVMF footer table size {size} does not fit the image")
    rest = data[footer_at - table_size:footer_at]
    table: dict[uuid.UUID, bytes] = {}
    while len(rest) >= _ENTRY_HEADER.size:
        entry_size, entry_guid = _ENTRY_HEADER.unpack_from(rest, len(rest) - _ENTRY_HEADER.size)
        if entry_size < _ENTRY_HEADER.size or entry_size > len(rest):
            raise ParseError(f"OVMF footer table entry of size {entry_size} is malformed")
        table[uuid.UUID(bytes_le=entry_guid)] = rest[len(rest) - entry_size:len(rest) - _ENTRY_HEADER.size]
        rest = rest[:len(rest) - entry_size]
    return table


def _metadata_sections(data: bytes, table: dict[uuid.UUID, bytes]) -> tuple[MetadataSection, ...]:
    entry = table.get(SEV_METADATA_GUID)
    if entry is None:
        return ()
    if len(entry) < 4:
        raise ParseError("OVMF SEV metadata entry is truncated")
    start = len(data) - int.from_bytes(entry[:4], "little")
    if start < 0 or start + _METADATA_HEADER.size > len(data):
        raise ParseError("OVMF SEV metadata offset points outside the image")
    signature, size, version, count = _METADATA_HEADER.unpack_from(data, start)
    if signature != b"ASEV" or version != 1:
        raise ParseError(f"OVMF SEV metadata has signature {signature!r} version {version}; expected ASEV v1")
    if size != _METADATA_HEADER.size + count * _SECTION.size or start + size > len(data):
        raise ParseError(f"OVMF SEV metadata of {count} items does not match its size {size}")
    sections = []
    for i in range(count):
        gpa, length, kind = _SECTION.unpack_from(data, start + _METADATA_HEADER.size + i * _SECTION.size)
        try:
            sections.append(MetadataSection(gpa, length, SectionType(kind)))
        except ValueError:
            raise ParseError(f"OVMF SEV metadata section {i} has unknown type {kind:#x}") from None
        if gpa % 4096 or length % 4096:
            raise ParseError(f"OVMF SEV metadata section {i} is not page aligned")
    return tuple(sections)


def parse_ovmf(data: bytes) -> Ovmf:
    if not data or len(data) % 4096:
        raise ParseError(f"OVMF image must be a non-empty multiple of 4096 bytes, got {len(data)}")
    table = _footer_table(data)
    return Ovmf(data=data, table=table, sections=_metadata_sections(data, table))


def read_ovmf(path: Path) -> Ovmf:
    return parse_ovmf(path.read_bytes())
