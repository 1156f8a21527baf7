"""SEV-SNP ATTESTATION_REPORT parsing at exact offsets (ABI spec #56860 rev 1.57, Table 23).

Strict by design: exact length, known versions only, must-be-zero and reserved bytes checked, so
that a verifier never appraises bytes it did not understand.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field, fields

from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature

from attestation.errors import ParseError, UnsupportedError
from attestation.snp.tcb import (
    GuestPolicy,
    PlatformInfo,
    Product,
    SignerInfo,
    TcbVersion,
    product_from_cpuid,
)

REPORT_SIZE = 0x4A0
SIGNED_SIZE = 0x2A0  # the signature covers bytes [0, 0x2A0)
SUPPORTED_VERSIONS = (2, 3, 5)
SIG_ALGO_ECDSA_P384_SHA384 = 1
SIG_COMPONENT_SIZE = 72  # Table 137 ECDSA signature: R and S are 72-byte little-endian fields
P384_SIZE = 48

# (offset, size, name) of every field of Table 23, in order. Gaps are reserved bytes.
_LAYOUT: tuple[tuple[int, int, str], ...] = (
    (0x000, 4, "version"),
    (0x004, 4, "guest_svn"),
    (0x008, 8, "policy"),
    (0x010, 16, "family_id"),
    (0x020, 16, "image_id"),
    (0x030, 4, "vmpl"),
    (0x034, 4, "signature_algo"),
    (0x038, 8, "current_tcb"),
    (0x040, 8, "platform_info"),
    (0x048, 4, "signer_info"),
    (0x050, 64, "report_data"),
    (0x090, 48, "measurement"),
    (0x0C0, 32, "host_data"),
    (0x0E0, 48, "id_key_digest"),
    (0x110, 48, "author_key_digest"),
    (0x140, 32, "report_id"),
    (0x160, 32, "report_id_ma"),
    (0x180, 8, "reported_tcb"),
    (0x188, 1, "cpuid_fam_id"),
    (0x189, 1, "cpuid_mod_id"),
    (0x18A, 1, "cpuid_step"),
    (0x1A0, 64, "chip_id"),
    (0x1E0, 8, "committed_tcb"),
    (0x1E8, 1, "current_build"),
    (0x1E9, 1, "current_minor"),
    (0x1EA, 1, "current_major"),
    (0x1EC, 1, "committed_build"),
    (0x1ED, 1, "committed_minor"),
    (0x1EE, 1, "committed_major"),
    (0x1F0, 8, "launch_tcb"),
    (0x1F8, 8, "launch_mit_vector"),
    (0x200, 8, "current_mit_vector"),
)
_BYTES_FIELDS = frozenset(
    {
        "family_id",
        "image_id",
        "report_data",
        "measurement",
        "host_data",
        "id_key_digest",
        "author_key_digest",
        "report_id",
        "report_id_ma",
        "chip_id",
    }
)


def _reserved_ranges(version: int) -> tuple[tuple[int, int], ...]:
    """Must-be-zero ranges of Table 23 for a report version (v2 predates CPUID, v5 adds MIT vectors)."""
    cpuid_end = 0x188 if version == 2 else 0x18B
    tail_start = 0x208 if version >= 5 else 0x1F8
    return (
        (0x04C, 0x050),
        (cpuid_end, 0x1A0),
        (0x1EB, 0x1EC),
        (0x1EF, 0x1F0),
        (tail_start, SIGNED_SIZE),
        # Signature (Table 137): only the low 48 bytes of R and S are meaningful for P-384.
        (SIGNED_SIZE + P384_SIZE, SIGNED_SIZE + SIG_COMPONENT_SIZE),
        (SIGNED_SIZE + SIG_COMPONENT_SIZE + P384_SIZE, SIGNED_SIZE + 2 * SIG_COMPONENT_SIZE),
        (SIGNED_SIZE + 2 * SIG_COMPONENT_SIZE, REPORT_SIZE),
    )


@dataclass(frozen=True)
class Report:
    """Every field of ATTESTATION_REPORT (Table 23). TCB fields stay raw u64 until the product is known."""

    version: int
    guest_svn: int
    policy: int
    family_id: bytes
    image_id: bytes
    vmpl: int
    signature_algo: int
    current_tcb: int
    platform_info: int
    signer_info: int
    report_data: bytes
    measurement: bytes
    host_data: bytes
    id_key_digest: bytes
    author_key_digest: bytes
    report_id: bytes
    report_id_ma: bytes
    reported_tcb: int
    cpuid_fam_id: int
    cpuid_mod_id: int
    cpuid_step: int
    chip_id: bytes
    committed_tcb: int
    current_build: int
    current_minor: int
    current_major: int
    committed_build: int
    committed_minor: int
    committed_major: int
    launch_tcb: int
    launch_mit_vector: int
    current_mit_vector: int
    signature_r: int
    signature_s: int
    raw: bytes = field(default=b"", repr=False, compare=False)

    @property
    def guest_policy(self) -> GuestPolicy:
        return GuestPolicy.decode(self.policy)

    @property
    def platform(self) -> PlatformInfo:
        return PlatformInfo.decode(self.platform_info)

    @property
    def signer(self) -> SignerInfo:
        return SignerInfo.decode(self.signer_info)

    @property
    def cpuid_product(self) -> Product | None:
        return product_from_cpuid(self.cpuid_fam_id, self.cpuid_mod_id)

    @property
    def signed_bytes(self) -> bytes:
        return self.raw[:SIGNED_SIZE] if self.raw else encode_report(self)[:SIGNED_SIZE]

    def tcb(self, which: str, product: Product) -> TcbVersion:
        """Decode one of current/reported/committed/launch TCB with the product's layout."""
        if which not in ("current", "reported", "committed", "launch"):
            raise ValueError(f"unknown TCB field {which!r}")
        return TcbVersion.decode(getattr(self, f"{which}_tcb"), product)

    def signature_der(self) -> bytes:
        """R and S (little-endian in the report) as the DER ECDSA-Sig-Value cryptography expects."""
        return encode_dss_signature(self.signature_r, self.signature_s)


def parse_report(data: bytes) -> Report:
    """Parse and strictly check one 1184-byte report; raises ParseError or UnsupportedError."""
    # Step 1 (Table 23): exact size; a truncated or padded report is not a report.
    if not isinstance(data, bytes | bytearray | memoryview):
        raise ParseError(f"report must be bytes, not {type(data).__name__}")
    data = bytes(data)
    if len(data) != REPORT_SIZE:
        raise ParseError(f"SNP report must be {REPORT_SIZE} bytes, got {len(data)}")
    # Step 2 (Table 23 VERSION): field meaning changes between versions, so unknown ones are refused.
    version = struct.unpack_from("<I", data, 0)[0]
    if version not in SUPPORTED_VERSIONS:
        raise UnsupportedError(f"SNP report version {version} not supported (know {SUPPORTED_VERSIONS})")
    # Step 3: reserved and must-be-zero bytes.
    for start, end in _reserved_ranges(version):
        if any(data[start:end]):
            raise ParseError(f"SNP report v{version}: reserved bytes [{start:#x}, {end:#x}) are not zero")
    values: dict[str, int | bytes] = {}
    for off, size, name in _LAYOUT:
        chunk = data[off : off + size]
        values[name] = chunk if name in _BYTES_FIELDS else int.from_bytes(chunk, "little")
    r_off = SIGNED_SIZE
    s_off = SIGNED_SIZE + SIG_COMPONENT_SIZE
    values["signature_r"] = int.from_bytes(data[r_off : r_off + SIG_COMPONENT_SIZE], "little")
    values["signature_s"] = int.from_bytes(data[s_off : s_off + SIG_COMPONENT_SIZE], "little")
    report = Report(**values, raw=data)  # type: ignore[arg-type]
    # Step 4: decode the bit fields now so reserved bits fail at parse time, not at appraisal.
    report.guest_policy  # noqa: B018
    report.platform  # noqa: B018
    report.signer  # noqa: B018
    if report.vmpl > 3:
        raise ParseError(f"VMPL {report.vmpl} out of range 0-3")
    # Step 5: with CPUID (v3+) the TCB layout is known, so reserved TCB bytes can be checked here.
    product = report.cpuid_product
    if product is not None:
        for which in ("current", "reported", "committed", "launch"):
            report.tcb(which, product)
    return report


def encode_report(report: Report) -> bytes:
    """Serialise a Report (the inverse of parse_report); used by attesters' tests and tooling."""
    out = bytearray(REPORT_SIZE)
    for off, size, name in _LAYOUT:
        value = getattr(report, name)
        if isinstance(value, bytes):
            if len(value) != size:
                raise ParseError(f"{name} must be {size} bytes, got {len(value)}")
            out[off : off + size] = value
        else:
            out[off : off + size] = int(value).to_bytes(size, "little")
    r_off = SIGNED_SIZE
    s_off = SIGNED_SIZE + SIG_COMPONENT_SIZE
    out[r_off : r_off + SIG_COMPONENT_SIZE] = report.signature_r.to_bytes(SIG_COMPONENT_SIZE, "little")
    out[s_off : s_off + SIG_COMPONENT_SIZE] = report.signature_s.to_bytes(SIG_COMPONENT_SIZE, "little")
    return bytes(out)


def report_fields(report: Report) -> dict[str, int | bytes]:
    """Field name -> value for every Table 23 field (no raw bytes)."""
    return {f.name: getattr(report, f.name) for f in fields(report) if f.name != "raw"}
