"""NVIDIA Hopper GPU attestation report: SPDM 1.1 GET_MEASUREMENTS request + MEASUREMENTS response.

Layout from DMTF DSP0274 (SPDM) 1.1, clause "GET_MEASUREMENTS request and MEASUREMENTS response
messages" (cited below as [GM]: the request and response message tables, "Measurement block" and
"DMTF measurement specification format"), plus NVIDIA's opaque-data TLVs (nvtrust local GPU
verifier, spdm_msrt_resp_msg.py). Table numbers differ between 1.1.x errata, so clause names are
cited. Every length is checked; nothing is skipped.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from attestation.errors import ParseError

SPDM_VERSION_11 = 0x11
GET_MEASUREMENTS = 0xE0
MEASUREMENTS = 0x60
REQUEST_LEN = 37  # 4 header + 32 nonce + 1 SlotIDParam (present because a signature is requested)
NONCE_LEN = 32
SIGNATURE_LEN = 96  # ECDSA P-384 r||s, big-endian (DSP0274 1.1 "Signature generation": raw, not DER)
SHA384_LEN = 48
MAX_OPAQUE_LEN = 1024  # [GM] response table: OpaqueLength shall not exceed 1024
# Trustee's CoCo sample (MANIFEST 3b) ends with exactly one 0x00 after the signature; the driver
# pads its buffer. One zero byte is tolerated and nothing more, so appended data cannot hide.
MAX_TRAILING_ZEROS = 1

# NVIDIA opaque-data field ids (nvtrust OPAQUE_DATA_TYPES). 26-31 are unassigned there.
OPAQUE_NAMES: dict[int, str] = {
    1: "CERT_ISSUER_NAME", 2: "CERT_AUTHORITY_KEY_IDENTIFIER", 3: "DRIVER_VERSION", 4: "GPU_INFO",
    5: "SKU", 6: "VBIOS_VERSION", 7: "MANUFACTURER_ID", 8: "TAMPER_DETECTION", 9: "SMC", 10: "VPR",
    11: "NVDEC0_STATUS", 12: "MSRSCNT", 13: "CPRINFO", 14: "BOARD_ID", 15: "CHIP_SKU",
    16: "CHIP_SKU_MOD", 17: "PROJECT", 18: "PROJECT_SKU", 19: "PROJECT_SKU_MOD", 20: "FWID",
    21: "PROTECTED_PCIE_STATUS", 22: "SWITCH_PDI", 23: "FLOORSWEPT_PORTS", 24: "POSITION_ID",
    25: "LOCK_SWITCH_STATUS", 32: "GPU_LINK_CONN", 33: "SYS_ENABLE_STATUS",
    34: "OPAQUE_DATA_VERSION", 35: "CHIP_INFO", 36: "FEATURE_FLAG",
}
_ASCII_FIELDS = frozenset({3, 15, 16, 17, 18, 19})
_FIXED_SIZES = {6: 8, 20: SHA384_LEN}  # VBIOS version is 8 raw bytes, FWID a SHA-384 digest
FEATURE_FLAGS = {0: "SPT", 1: "MPT", 2: "PPCIE"}


@dataclass(frozen=True)
class MeasurementRequest:
    """GET_MEASUREMENTS request ([GM] request table)."""

    version: int
    code: int
    param1: int  # bit 0: signature requested
    param2: int  # 0xFF: all measurement blocks
    nonce: bytes
    slot: int


@dataclass(frozen=True)
class MeasurementBlock:
    """One measurement block ([GM] "Measurement block", "DMTF measurement specification format")."""

    index: int
    spec: int
    value_type: int  # bit 7: raw bit stream; bits 0-6: component kind
    value: bytes


@dataclass(frozen=True)
class OpaqueField:
    type: int
    name: str
    value: bytes


@dataclass(frozen=True)
class GpuEvidence:
    """A parsed report. `signed` is what the leaf key signs: request || response minus signature."""

    raw: bytes
    request: MeasurementRequest
    resp_version: int
    resp_code: int
    resp_param1: int
    resp_param2: int
    blocks: tuple[MeasurementBlock, ...]
    responder_nonce: bytes
    opaque: tuple[OpaqueField, ...]
    signature: bytes
    signed: bytes
    trailing: int

    @property
    def nonce(self) -> bytes:
        return self.request.nonce

    @property
    def measurements(self) -> dict[int, bytes]:
        return {b.index: b.value for b in self.blocks}

    def field(self, name: str) -> bytes | None:
        return next((f.value for f in self.opaque if f.name == name), None)

    def text(self, name: str) -> str:
        value = self.field(name)
        return "" if value is None else _ascii(value, name)

    @property
    def driver_version(self) -> str:
        return self.text("DRIVER_VERSION")

    @property
    def vbios_version(self) -> str:
        raw = self.field("VBIOS_VERSION")
        return "" if raw is None else format_vbios_version(raw)

    @property
    def fwid(self) -> bytes:
        return self.field("FWID") or b""

    @property
    def feature_flag(self) -> str | None:
        raw = self.field("FEATURE_FLAG")
        if raw is None:
            return None  # older opaque data (no version field) predates the flag
        value = int.from_bytes(raw, "little")
        return FEATURE_FLAGS.get(value, f"UNKNOWN({value})")

    @property
    def measurement_counts(self) -> dict[int, int]:
        """MSRSCNT: u32 LE per block, keyed like the blocks (1-based), as trustee reports it."""
        raw = self.field("MSRSCNT") or b""
        return {i // 4 + 1: int.from_bytes(raw[i : i + 4], "little") for i in range(0, len(raw), 4)}

    def info(self) -> dict[str, str]:
        """Opaque data as printable strings, for claims and `inspect`."""
        out: dict[str, str] = {}
        for f in self.opaque:
            if f.type in _ASCII_FIELDS:
                out[f.name] = _ascii(f.value, f.name)
            elif f.name == "VBIOS_VERSION":
                out[f.name] = format_vbios_version(f.value)
            else:
                out[f.name] = f.value.hex()
        return out


def format_vbios_version(raw: bytes) -> str:
    """nvtrust's VBIOS format: 8 raw bytes b0..b7 print as b3.b2.b1.b0.b4 in upper-case hex."""
    if len(raw) != 8:
        raise ParseError(f"VBIOS version must be 8 bytes, got {len(raw)}")
    return f"{raw[3]:02X}.{raw[2]:02X}.{raw[1]:02X}.{raw[0]:02X}.{raw[4]:02X}"


def _ascii(value: bytes, name: str) -> str:
    text = value.rstrip(b"\x00")
    if b"\x00" in text or not all(0x20 <= c < 0x7F for c in text):
        raise ParseError(f"opaque field {name} is not a NUL-padded printable ASCII string")
    return text.decode("ascii")



def parse_request(data: bytes) -> MeasurementRequest:
    """Step 1: GET_MEASUREMENTS request, [GM] request table, 37 bytes."""
    if len(data) != REQUEST_LEN:
        raise ParseError(f"GET_MEASUREMENTS request must be {REQUEST_LEN} bytes, got {len(data)}")
    version, code, param1, param2 = data[0], data[1], data[2], data[3]
    if version != SPDM_VERSION_11:
        raise ParseError(f"request SPDMVersion 0x{version:02x}, expected 0x11")
    if code != GET_MEASUREMENTS:
        raise ParseError(f"request code 0x{code:02x} is not GET_MEASUREMENTS (0xe0)")
    # Step 1a: [GM] request attributes, Param1 bit 0 = signature requested; else nothing is signed.
    if param1 != 0x01:
        raise ParseError(f"request Param1 0x{param1:02x}: a signed measurement (0x01) is required")
    # Step 1b: Param2 0xFF = all measurement blocks, the only mode NVIDIA's verifier appraises.
    if param2 != 0xFF:
        raise ParseError(f"request Param2 0x{param2:02x}: all measurements (0xff) are required")
    slot = data[36]
    if slot > 7:  # SlotIDParam bits 4-7 are reserved, slots are 0-7
        raise ParseError(f"request SlotIDParam 0x{slot:02x} out of range")
    return MeasurementRequest(version, code, param1, param2, bytes(data[4:36]), slot)


def _parse_blocks(record: bytes, count: int) -> tuple[MeasurementBlock, ...]:
    """Step 3: MeasurementRecord, `count` measurement blocks, each a DMTF measurement field ([GM])."""
    blocks: list[MeasurementBlock] = []
    seen: set[int] = set()
    off = 0
    for _ in range(count):
        if len(record) - off < 4:
            raise ParseError("measurement record ends inside a block header")
        index, spec = record[off], record[off + 1]
        (size,) = struct.unpack_from("<H", record, off + 2)
        off += 4
        if index in (0, 0xFF) or index in seen:  # 0 and 0xFF are reserved; indices are unique
            raise ParseError(f"measurement block index {index} reserved or repeated")
        seen.add(index)
        if spec != 0x01:  # bit 0 = DMTF format, the only one NVIDIA emits and RIMs describe
            raise ParseError(f"measurement block {index}: MeasurementSpecification 0x{spec:02x} is not DMTF")
        if size < 3 or len(record) - off < size:
            raise ParseError(f"measurement block {index}: size {size} overruns the record")
        value_type = record[off]
        (value_size,) = struct.unpack_from("<H", record, off + 1)
        if value_size != size - 3:
            raise ParseError(f"measurement block {index}: DMTF value size {value_size} != {size - 3}")
        value = bytes(record[off + 3 : off + size])
        # Digest values (bit 7 clear) use the negotiated hash, TPM_ALG_SHA_384 on Hopper.
        if not value_type & 0x80 and value_size != SHA384_LEN:
            raise ParseError(f"measurement block {index}: digest of {value_size} bytes, expected 48")
        blocks.append(MeasurementBlock(index, spec, value_type, value))
        off += size
    if off != len(record):
        raise ParseError(f"measurement record has {len(record) - off} bytes after {count} blocks")
    return tuple(blocks)


def _parse_opaque(data: bytes) -> tuple[OpaqueField, ...]:
    """NVIDIA opaque data: TLVs of type u16 LE, length u16 LE, value, filling OpaqueData exactly."""
    fields: list[OpaqueField] = []
    off = 0
    while off < len(data):
        if len(data) - off < 4:
            raise ParseError("opaque data ends inside a TLV header")
        kind, size = struct.unpack_from("<HH", data, off)
        off += 4
        name = OPAQUE_NAMES.get(kind)
        if name is None:
            raise ParseError(f"unknown opaque data type {kind}")
        if any(f.type == kind for f in fields):
            raise ParseError(f"opaque data type {name} repeated")
        if len(data) - off < size:
            raise ParseError(f"opaque field {name}: length {size} overruns the opaque data")
        value = bytes(data[off : off + size])
        expected = _FIXED_SIZES.get(kind)
        if expected is not None and size != expected:
            raise ParseError(f"opaque field {name} must be {expected} bytes, got {size}")
        if kind == 12 and size % 4:
            raise ParseError("opaque field MSRSCNT is not a list of u32")
        if kind in _ASCII_FIELDS:
            _ascii(value, name)
        fields.append(OpaqueField(kind, name, value))
        off += size
    return tuple(fields)


def parse_evidence(data: bytes) -> GpuEvidence:
    """Parse request || response || [one 0x00]; raises ParseError on any deviation."""
    if not isinstance(data, bytes | bytearray | memoryview):
        raise ParseError("evidence must be bytes")
    data = bytes(data)
    request = parse_request(data[:REQUEST_LEN])
    resp = data[REQUEST_LEN:]
    # Step 2: MEASUREMENTS response header ([GM] response table), fixed 8 bytes.
    if len(resp) < 8:
        raise ParseError("evidence ends inside the MEASUREMENTS header")
    version, code, param1, param2, count = resp[0], resp[1], resp[2], resp[3], resp[4]
    if version != SPDM_VERSION_11:
        raise ParseError(f"response SPDMVersion 0x{version:02x}, expected 0x11")
    if code != MEASUREMENTS:
        raise ParseError(f"response code 0x{code:02x} is not MEASUREMENTS (0x60)")
    if param1 != 0:  # only meaningful for a request of operation 0; reserved otherwise
        raise ParseError(f"response Param1 0x{param1:02x} must be 0 for an all-blocks request")
    if param2 != request.slot:  # 1.1: Param2 bits 0-3 echo the slot, the rest is reserved
        raise ParseError(f"response Param2 0x{param2:02x} does not echo slot {request.slot}")
    if count == 0:
        raise ParseError("response carries no measurement blocks")
    record_len = int.from_bytes(resp[5:8], "little")
    off = 8
    if len(resp) - off < record_len:
        raise ParseError(f"MeasurementRecordLength {record_len} overruns the evidence")
    blocks = _parse_blocks(resp[off : off + record_len], count)
    off += record_len
    # Step 4: 32-byte responder nonce, then OpaqueLength u16 and OpaqueData ([GM] response table).
    if len(resp) - off < NONCE_LEN + 2:
        raise ParseError("evidence ends before the responder nonce and OpaqueLength")
    responder_nonce = bytes(resp[off : off + NONCE_LEN])
    (opaque_len,) = struct.unpack_from("<H", resp, off + NONCE_LEN)
    off += NONCE_LEN + 2
    if opaque_len > MAX_OPAQUE_LEN or len(resp) - off < opaque_len:
        raise ParseError(f"OpaqueLength {opaque_len} exceeds the limit or the evidence")
    opaque = _parse_opaque(resp[off : off + opaque_len])
    off += opaque_len
    # Step 5: Signature ([GM], present because Param1 bit 0 was set), then tolerated padding.
    if len(resp) - off < SIGNATURE_LEN:
        raise ParseError("evidence ends inside the 96-byte signature")
    signature = bytes(resp[off : off + SIGNATURE_LEN])
    tail = resp[off + SIGNATURE_LEN :]
    if len(tail) > MAX_TRAILING_ZEROS or tail.strip(b"\x00"):
        raise ParseError(f"{len(tail)} unexpected bytes after the signature")
    signed = data[: REQUEST_LEN + off]
    return GpuEvidence(
        raw=data, request=request, resp_version=version, resp_code=code, resp_param1=param1,
        resp_param2=param2, blocks=blocks, responder_nonce=responder_nonce, opaque=opaque,
        signature=signature, signed=signed, trailing=len(tail),
    )
