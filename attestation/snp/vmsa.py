"""The initial VMSA (VMCB save area, AMD APM vol. 2 table B-4) of each vCPU, as QEMU/KVM, EC2 and GCE
create it for an SEV-SNP launch. Each page is measured into the launch digest, so every byte counts.

Fields are written at their exact offsets in one 4096-byte page; everything else is zero.
"""

from __future__ import annotations

import enum
import struct

PAGE_SIZE = 4096
BSP_EIP = 0xFFFFFFF0
DEFAULT_PAT = 0x0007040600070406  # PAT MSR power-on value, AMD APM vol. 2 section A.3


class VmmType(enum.Enum):
    QEMU = "qemu"
    EC2 = "ec2"
    GCE = "gce"


def cpu_signature(family: int, model: int, stepping: int) -> int:
    """CPUID Fn0000_0001_EAX from family, model and stepping (AMD CPUID specification #25481)."""
    family_low, family_high = (0xF, (family - 0xF) & 0xFF) if family > 0xF else (family, 0)
    return (family_high << 20) | (((model >> 4) & 0xF) << 16) | (family_low << 8) | ((model & 0xF) << 4) | (
        stepping & 0xF)


# QEMU's built-in x86 CPU models (builtin_x86_defs) and their signatures.
_EPYC, _ROME, _MILAN = cpu_signature(23, 1, 2), cpu_signature(23, 49, 0), cpu_signature(25, 1, 1)
VCPU_TYPES: dict[str, int] = {
    **dict.fromkeys(("EPYC", "EPYC-v1", "EPYC-v2", "EPYC-IBPB", "EPYC-v3", "EPYC-v4"), _EPYC),
    **dict.fromkeys(("EPYC-Rome", "EPYC-Rome-v1", "EPYC-Rome-v2", "EPYC-Rome-v3"), _ROME),
    **dict.fromkeys(("EPYC-Milan", "EPYC-Milan-v1", "EPYC-Milan-v2"), _MILAN),
    **dict.fromkeys(("EPYC-Genoa", "EPYC-Genoa-v1"), cpu_signature(25, 17, 0)),
    "EPYC-Turin": cpu_signature(26, 0, 0),
}

# Offsets into the save area (struct sev_es_save_area in Linux's arch/x86/include/asm/svm.h).
_SEGMENTS = {"es": 0x000, "cs": 0x010, "ss": 0x020, "ds": 0x030, "fs": 0x040, "gs": 0x050,
             "gdtr": 0x060, "ldtr": 0x070, "idtr": 0x080, "tr": 0x090}
_U64 = {"efer": 0x0D0, "cr4": 0x148, "cr0": 0x158, "dr7": 0x160, "dr6": 0x168, "rflags": 0x170, "rip": 0x178,
        "g_pat": 0x268, "rdx": 0x310, "sev_features": 0x3B0, "xcr0": 0x3E8}
_MXCSR, _X87_FCW = 0x408, 0x410


def _segment(page: bytearray, name: str, selector: int, attrib: int, limit: int, base: int) -> None:
    struct.pack_into("<HHIQ", page, _SEGMENTS[name], selector, attrib, limit, base)


def vmsa_page(eip: int, sev_features: int, vcpu_sig: int, vmm: VmmType) -> bytes:
    """One vCPU's initial VMSA page; `eip` is the reset vector (BSP) or the SEV-ES AP reset address."""
    cs_attrib, ss_attrib, tr_attrib = 0x9B, 0x93, 0x8B
    g_pat, rdx, mxcsr, fcw = DEFAULT_PAT, vcpu_sig, 0x1F80, 0x37F
    if vmm is VmmType.EC2:
        cs_attrib = 0x9A if eip == BSP_EIP else 0x9B
        ss_attrib, tr_attrib, rdx, mxcsr, fcw = 0x92, 0x83, 0x600, 0, 0
    elif vmm is VmmType.GCE:
        g_pat, rdx, mxcsr, fcw = 0x00070106, 0x600, 0, 0  # GCE's hypervisor sets its own PAT
    page = bytearray(PAGE_SIZE)
    for name in ("es", "ds", "fs", "gs"):
        _segment(page, name, 0, 0x93, 0xFFFF, 0)
    _segment(page, "cs", 0xF000, cs_attrib, 0xFFFF, eip & 0xFFFF0000)
    _segment(page, "ss", 0, ss_attrib, 0xFFFF, 0)
    _segment(page, "gdtr", 0, 0, 0xFFFF, 0)
    _segment(page, "idtr", 0, 0, 0xFFFF, 0)
    _segment(page, "ldtr", 0, 0x82, 0xFFFF, 0)
    _segment(page, "tr", 0, tr_attrib, 0xFFFF, 0)
    registers = {"efer": 0x1000,  # KVM sets EFER.SVME
                 "cr4": 0x40,  # KVM sets CR4.MCE
                 "cr0": 0x10, "dr7": 0x400, "dr6": 0xFFFF0FF0, "rflags": 0x2, "rip": eip & 0xFFFF,
                 "g_pat": g_pat, "rdx": rdx, "sev_features": sev_features, "xcr0": 0x1}
    for name, value in registers.items():
        struct.pack_into("<Q", page, _U64[name], value)
    struct.pack_into("<I", page, _MXCSR, mxcsr)
    struct.pack_into("<H", page, _X87_FCW, fcw)
    return bytes(page)
