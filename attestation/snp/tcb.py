"""SEV-SNP bit fields: TCB_VERSION per product, GUEST_POLICY, PLATFORM_INFO and signer info.

Spec references are to the SEV Secure Nested Paging Firmware ABI Specification (AMD #56860,
rev 1.57). Table numbers move between revisions; the table *names* quoted here are authoritative.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from attestation.errors import ParseError, UnsupportedError


class Product(enum.StrEnum):
    """AMD EPYC generations with distinct KDS roots; the value is the KDS product name."""

    MILAN = "Milan"
    GENOA = "Genoa"
    TURIN = "Turin"

    @property
    def fmc_layout(self) -> bool:
        """Turin (family 1Ah) added an FMC SPL and moved the other TCB fields."""
        return self is Product.TURIN


def product_from_name(name: str) -> Product:
    """KDS productName extension: "Milan", "Milan-B0", "Genoa", "Turin" (stepping after '-')."""
    base = name.split("-", 1)[0].strip()
    for product in Product:
        if product.value.lower() == base.lower():
            return product
    raise UnsupportedError(f"unknown AMD product {name!r}")


def product_from_cpuid(family: int, model: int) -> Product | None:
    """Product from the report's CPUID_FAM_ID/CPUID_MOD_ID (v3+); None when not recorded (v2)."""
    if family == 0 and model == 0:
        return None
    # Family 19h: models 00h-0Fh Milan; 10h-1Fh Genoa and A0h-AFh Bergamo/Siena (KDS serves them as
    # "Genoa"). Family 1Ah: models 00h-1Fh Turin (classic and dense).
    if family == 0x19 and model >> 4 == 0x0:
        return Product.MILAN
    if family == 0x19 and model >> 4 in (0x1, 0xA):
        return Product.GENOA
    if family == 0x1A and model >> 4 in (0x0, 0x1):
        return Product.TURIN
    raise UnsupportedError(f"unknown AMD CPUID family {family:#x} model {model:#x}")


@dataclass(frozen=True)
class TcbVersion:
    """A decoded TCB_VERSION (Table 3 for family 19h Milan/Genoa, Table 4 for family 1Ah Turin)."""

    bl: int
    tee: int
    snp: int
    ucode: int
    fmc: int | None = None  # Turin only

    @classmethod
    def decode(cls, raw: int, product: Product) -> TcbVersion:
        b = raw.to_bytes(8, "little")
        if product.fmc_layout:
            # Turin: byte0 FMC, byte1 BOOT_LOADER, byte2 TEE, byte3 SNP, bytes4-6 reserved, byte7 UCODE.
            if any(b[4:7]):
                raise ParseError(f"TCB_VERSION {raw:#018x}: reserved bytes 4-6 set (Turin layout)")
            return cls(fmc=b[0], bl=b[1], tee=b[2], snp=b[3], ucode=b[7])
        # Milan/Genoa: byte0 BOOT_LOADER, byte1 TEE, bytes2-5 reserved, byte6 SNP, byte7 UCODE.
        if any(b[2:6]):
            raise ParseError(f"TCB_VERSION {raw:#018x}: reserved bytes 2-5 set (Milan/Genoa layout)")
        return cls(bl=b[0], tee=b[1], snp=b[6], ucode=b[7])

    def encode(self) -> int:
        if self.fmc is not None:
            b = bytes([self.fmc, self.bl, self.tee, self.snp, 0, 0, 0, self.ucode])
        else:
            b = bytes([self.bl, self.tee, 0, 0, 0, 0, self.snp, self.ucode])
        return int.from_bytes(b, "little")

    def as_dict(self) -> dict[str, int]:
        out = {"bl": self.bl, "tee": self.tee, "snp": self.snp, "ucode": self.ucode}
        if self.fmc is not None:
            out["fmc"] = self.fmc
        return out

    def dominates(self, floor: TcbVersion) -> bool:
        """Every component at or above `floor` (components absent from floor are ignored)."""
        mine = self.as_dict()
        return all(mine.get(k, -1) >= v for k, v in floor.as_dict().items())


# GUEST_POLICY (Table 9): bits 0-7 ABI_MINOR, 8-15 ABI_MAJOR, then single-bit flags.
POLICY_SMT = 1 << 16
POLICY_RESERVED_ONE = 1 << 17  # must be 1 per the spec
POLICY_MIGRATE_MA = 1 << 18
POLICY_DEBUG = 1 << 19
POLICY_SINGLE_SOCKET = 1 << 20
POLICY_CXL_ALLOW = 1 << 21
POLICY_MEM_AES_256_XTS = 1 << 22
POLICY_RAPL_DIS = 1 << 23
POLICY_CIPHERTEXT_HIDING = 1 << 24
POLICY_PAGE_SWAP_DISABLE = 1 << 25
POLICY_KNOWN_MASK = (1 << 26) - 1


@dataclass(frozen=True)
class GuestPolicy:
    abi_minor: int
    abi_major: int
    smt: bool
    migrate_ma: bool
    debug: bool
    single_socket: bool
    cxl_allow: bool
    mem_aes_256_xts: bool
    rapl_dis: bool
    ciphertext_hiding: bool
    page_swap_disable: bool

    @classmethod
    def decode(cls, raw: int) -> GuestPolicy:
        if raw & ~POLICY_KNOWN_MASK:
            raise ParseError(f"POLICY {raw:#x}: reserved bits 26-63 set")
        if not raw & POLICY_RESERVED_ONE:
            raise ParseError(f"POLICY {raw:#x}: bit 17 must be one")
        return cls(
            abi_minor=raw & 0xFF,
            abi_major=(raw >> 8) & 0xFF,
            smt=bool(raw & POLICY_SMT),
            migrate_ma=bool(raw & POLICY_MIGRATE_MA),
            debug=bool(raw & POLICY_DEBUG),
            single_socket=bool(raw & POLICY_SINGLE_SOCKET),
            cxl_allow=bool(raw & POLICY_CXL_ALLOW),
            mem_aes_256_xts=bool(raw & POLICY_MEM_AES_256_XTS),
            rapl_dis=bool(raw & POLICY_RAPL_DIS),
            ciphertext_hiding=bool(raw & POLICY_CIPHERTEXT_HIDING),
            page_swap_disable=bool(raw & POLICY_PAGE_SWAP_DISABLE),
        )


# PLATFORM_INFO (Table 23 field at 0x40): bit 6 and bits 8-63 are reserved.
PLATFORM_KNOWN_MASK = 0b1011_1111


@dataclass(frozen=True)
class PlatformInfo:
    smt_enabled: bool
    tsme_enabled: bool
    ecc_enabled: bool
    rapl_disabled: bool
    ciphertext_hiding_enabled: bool
    alias_check_complete: bool
    tio_enabled: bool

    @classmethod
    def decode(cls, raw: int) -> PlatformInfo:
        if raw & ~PLATFORM_KNOWN_MASK:
            raise ParseError(f"PLATFORM_INFO {raw:#x}: reserved bits set")
        return cls(*(bool(raw >> bit & 1) for bit in (0, 1, 2, 3, 4, 5, 7)))


class SigningKey(enum.IntEnum):
    """SIGNING_KEY encoding in the report's key-info word (0x48, bits 4:2)."""

    VCEK = 0
    VLEK = 1
    NONE = 7


@dataclass(frozen=True)
class SignerInfo:
    author_key_en: bool
    mask_chip_key: bool
    signing_key: SigningKey

    @classmethod
    def decode(cls, raw: int) -> SignerInfo:
        if raw >> 5:
            raise ParseError(f"signer info {raw:#x}: reserved bits 5-31 set")
        key = (raw >> 2) & 0b111
        try:
            signing_key = SigningKey(key)
        except ValueError:
            raise ParseError(f"signer info {raw:#x}: reserved SIGNING_KEY value {key}") from None
        return cls(author_key_en=bool(raw & 1), mask_chip_key=bool(raw & 2), signing_key=signing_key)

    def encode(self) -> int:
        return int(self.author_key_en) | int(self.mask_chip_key) << 1 | int(self.signing_key) << 2
