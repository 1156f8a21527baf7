"""The SEV-SNP launch digest (the report's MEASUREMENT) of a QEMU/OVMF guest, computed offline.

SEV-SNP firmware ABI, section 8.17 (SNP_LAUNCH_UPDATE): every page added to the guest extends the
digest as `LD = SHA-384(PAGE_INFO)`, PAGE_INFO being (table 67) the previous digest, the page's
contents digest, its length (0x70), page type, IMI flag, VMPL permissions and guest-physical address.
The order below is the order in which QEMU adds pages, so the result equals the MEASUREMENT a
guest launched the same way reports; the tenant's release policy and the published reference
values hold exactly this value.
"""

from __future__ import annotations

import enum
import hashlib
import struct
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from attestation.errors import ParseError
from attestation.snp.ovmf import Ovmf, SectionType
from attestation.snp.vmsa import BSP_EIP, PAGE_SIZE, VmmType, vmsa_page

DIGEST_SIZE = 48
VMSA_GPA = 0xFFFFFFFFF000  # the RMP records a VMSA at GPA -1, page aligned, bits above 51 clear
_PAGE_INFO = struct.Struct("<48s48sHBBBBBBQ")

_HASH_TABLE_GUID = uuid.UUID("9438d606-4f22-4cc9-b479-a793d411fd21")
_KERNEL_GUID = uuid.UUID("4de79437-abd2-427f-b835-d5b172d2045b")
_INITRD_GUID = uuid.UUID("44baf731-3a2f-4bd7-9af1-41e29169781d")
_CMDLINE_GUID = uuid.UUID("97d02dd8-bd20-4c94-aa78-e7714d36ab2a")


class PageType(enum.IntEnum):
    """SNP_LAUNCH_UPDATE page types (table 69)."""

    NORMAL = 1
    VMSA = 2
    ZERO = 3
    UNMEASURED = 4
    SECRETS = 5
    CPUID = 6


class GuestContext:
    """The running launch digest."""

    def __init__(self, seed: bytes = bytes(DIGEST_SIZE)) -> None:
        if len(seed) != DIGEST_SIZE:
            raise ParseError(f"a launch digest seed is {DIGEST_SIZE} bytes, got {len(seed)}")
        self.digest = seed

    def _extend(self, page_type: PageType, gpa: int, contents_digest: bytes) -> None:
        # Table 67: DIGEST_CUR, CONTENTS, LENGTH=0x70, PAGE_TYPE, IMI_PAGE=0, VMPL3/2/1_PERMS=0, reserved, GPA
        info = _PAGE_INFO.pack(self.digest, contents_digest, _PAGE_INFO.size, page_type, 0, 0, 0, 0, 0, gpa)
        self.digest = hashlib.sha384(info).digest()

    def normal_pages(self, gpa: int, data: bytes) -> None:
        for offset in range(0, len(data), PAGE_SIZE):
            self._extend(PageType.NORMAL, gpa + offset, hashlib.sha384(data[offset:offset + PAGE_SIZE]).digest())

    def empty_pages(self, page_type: PageType, gpa: int, length: int) -> None:
        for offset in range(0, length, PAGE_SIZE):
            self._extend(page_type, gpa + offset, bytes(DIGEST_SIZE))

    def vmsa(self, page: bytes) -> None:
        self._extend(PageType.VMSA, VMSA_GPA, hashlib.sha384(page).digest())


@dataclass(frozen=True)
class DirectBoot:
    """Kernel, initrd and command line whose SHA-256 QEMU places in the OVMF hash table page."""

    kernel: bytes
    initrd: bytes
    append: str

    def table(self) -> bytes:
        entries = b"".join(guid.bytes_le + struct.pack("<H", 50) + hashlib.sha256(data).digest()
                           for guid, data in ((_CMDLINE_GUID, self.append.encode() + b"\0"),
                                              (_INITRD_GUID, self.initrd), (_KERNEL_GUID, self.kernel)))
        table = _HASH_TABLE_GUID.bytes_le + struct.pack("<H", 18 + len(entries)) + entries
        return table + bytes(-len(table) % 16)  # QEMU pads the table to 16 bytes

    def page(self, offset_in_page: int) -> bytes:
        table = self.table()
        if offset_in_page + len(table) > PAGE_SIZE:
            raise ParseError(f"the SEV hash table at page offset {offset_in_page:#x} crosses the page end")
        return bytes(offset_in_page) + table + bytes(PAGE_SIZE - offset_in_page - len(table))


def load_direct_boot(kernel: Path | None, initrd: Path | None, append: str | None) -> DirectBoot | None:
    if kernel is None:
        if initrd is not None or append:
            raise ParseError("--initrd and --append are measured only with --kernel")
        return None
    return DirectBoot(kernel.read_bytes(), initrd.read_bytes() if initrd else b"", append or "")


def ovmf_digest(ovmf: Ovmf) -> bytes:
    """The digest after the firmware pages alone (what `--ovmf-hash` takes precomputed)."""
    gctx = GuestContext()
    gctx.normal_pages(ovmf.gpa, ovmf.data)
    return gctx.digest


def _metadata_pages(gctx: GuestContext, ovmf: Ovmf, boot: DirectBoot | None, vmm: VmmType) -> None:
    for section in ovmf.sections:
        if section.kind is SectionType.SNP_SEC_MEM:
            kind = PageType.UNMEASURED if vmm is VmmType.GCE else PageType.ZERO
            gctx.empty_pages(kind, section.gpa, section.size)
        elif section.kind is SectionType.SNP_SECRETS:
            gctx.empty_pages(PageType.SECRETS, section.gpa, PAGE_SIZE)
        elif section.kind is SectionType.CPUID:
            if vmm is not VmmType.EC2:  # EC2 adds the CPUID page after every other section
                gctx.empty_pages(PageType.CPUID, section.gpa, PAGE_SIZE)
        elif section.kind is SectionType.SNP_KERNEL_HASHES:
            if boot is None:
                gctx.empty_pages(PageType.ZERO, section.gpa, section.size)
            else:
                page = boot.page(ovmf.sev_hashes_table_gpa() & (PAGE_SIZE - 1))
                if section.size != len(page):
                    raise ParseError(f"the kernel hashes section is {section.size} bytes, not one page")
                gctx.normal_pages(section.gpa, page)
        else:  # SVSM_CAA
            gctx.empty_pages(PageType.ZERO, section.gpa, section.size)
    if vmm is VmmType.EC2:
        for section in ovmf.sections:
            if section.kind is SectionType.CPUID:
                gctx.empty_pages(PageType.CPUID, section.gpa, PAGE_SIZE)
    if boot is not None and not ovmf.has_section(SectionType.SNP_KERNEL_HASHES):
        raise ParseError("a kernel was given but the OVMF metadata has no SNP_KERNEL_HASHES section")


def vmsa_pages(ovmf: Ovmf, vcpus: int, vcpu_sig: int, guest_features: int, vmm: VmmType) -> Iterable[bytes]:
    bsp = vmsa_page(BSP_EIP, guest_features, vcpu_sig, vmm)
    ap = vmsa_page(ovmf.sev_es_reset_eip(), guest_features, vcpu_sig, vmm) if vcpus > 1 else b""
    return [bsp, *([ap] * (vcpus - 1))]


def snp_launch_digest(ovmf: Ovmf, *, vcpus: int, vcpu_sig: int, boot: DirectBoot | None = None,
                      guest_features: int = 0x1, vmm: VmmType = VmmType.QEMU,
                      ovmf_hash: bytes | None = None) -> bytes:
    """MEASUREMENT of an SEV-SNP guest launched with this firmware, direct-boot files and vCPUs."""
    if vcpus < 1:
        raise ParseError("an SEV-SNP guest has at least one vCPU")
    gctx = GuestContext(ovmf_hash) if ovmf_hash is not None else GuestContext()
    if ovmf_hash is None:
        gctx.normal_pages(ovmf.gpa, ovmf.data)
    _metadata_pages(gctx, ovmf, boot, vmm)
    for page in vmsa_pages(ovmf, vcpus, vcpu_sig, guest_features, vmm):
        gctx.vmsa(page)
    return gctx.digest
