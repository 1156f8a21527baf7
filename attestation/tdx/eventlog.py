"""The TDX CC event log (ACPI CCEL) and RTMR replay.

Format: TCG PC Client Platform Firmware Profile 2.0, "crypto agile" log. The first event is a
SHA-1-format TCG_PCR_EVENT carrying the "Spec ID Event03" structure (section 10.4.5.1, table 20),
which names the digest algorithms and their sizes; every later event is a TCG_PCR_EVENT2
(section 10.2.2): MR index, event type, TPML_DIGEST_VALUES, event size, event data. In the CC
log the index names a measurement register (UEFI spec 2.10, EFI_CC_MEASUREMENT_PROTOCOL): 0 is
MRTD, 1..4 are RTMR0..3. The rest of the log area is padding (0xFF or 0x00).

Replay (Intel TDX module spec, TDG.MR.RTMR.EXTEND): RTMR[i] = SHA-384(RTMR[i] ‖ digest), from 48
zero bytes. EV_NO_ACTION events are informational and never extended.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass

from attestation.errors import ParseError

SHA384_ALG_ID = 0x000C
EV_NO_ACTION = 0x00000003
RTMR_COUNT = 4
_SPEC_ID_SIGNATURE = b"Spec ID Event03\x00"
_MAX_ALGORITHMS = 16
_MAX_EVENT_SIZE = 16 << 20


@dataclass(frozen=True)
class CcEvent:
    mr_index: int
    event_type: int
    digests: dict[int, bytes]
    data: bytes


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data, self.offset = data, 0

    def take(self, n: int, what: str) -> bytes:
        if n < 0 or self.offset + n > len(self.data):
            raise ParseError(f"CC event log truncated in {what} at offset {self.offset}")
        chunk = self.data[self.offset:self.offset + n]
        self.offset += n
        return chunk

    def u8(self, what: str) -> int:
        return self.take(1, what)[0]

    def u16(self, what: str) -> int:
        return int(struct.unpack("<H", self.take(2, what))[0])

    def u32(self, what: str) -> int:
        return int(struct.unpack("<I", self.take(4, what))[0])


def _spec_id_sizes(reader: _Reader) -> dict[int, int]:
    # Steps 1-2 (table 20): the SHA-1-format header event, then the Spec ID structure.
    reader.u32("header MR index")  # TDVF writes 1 here, TPM logs 0: informational either way
    if reader.u32("header event type") != EV_NO_ACTION:
        raise ParseError("CC event log does not start with an EV_NO_ACTION Spec ID event")
    reader.take(20, "header SHA-1 digest")
    body = _Reader(reader.take(reader.u32("header event size"), "Spec ID event"))
    if body.take(16, "Spec ID signature") != _SPEC_ID_SIGNATURE:
        raise ParseError("CC event log header is not a 'Spec ID Event03' (not a crypto-agile log)")
    body.take(4 + 4, "platform class and versions")
    count = body.u32("algorithm count")
    if not 0 < count <= _MAX_ALGORITHMS:
        raise ParseError(f"CC event log names {count} digest algorithms")
    sizes = {}
    for _ in range(count):
        alg, size = body.u16("algorithm id"), body.u16("digest size")
        sizes[alg] = size
    if sizes.get(SHA384_ALG_ID) != 48:
        raise ParseError("CC event log has no 48-byte SHA-384 digests; RTMRs cannot be replayed")
    return sizes


def _is_padding(reader: _Reader) -> bool:
    head = reader.data[reader.offset:reader.offset + 8]
    return head in (b"\xff" * 8, b"\x00" * 8) or len(head) < 8


def parse_cc_event_log(data: bytes) -> list[CcEvent]:
    """Every event of the log, in order; malformed or truncated input raises ParseError."""
    reader = _Reader(data)
    sizes = _spec_id_sizes(reader)
    events: list[CcEvent] = []
    # Step 3 (section 10.2.2): TCG_PCR_EVENT2 records until the padding.
    while not _is_padding(reader):
        mr_index, event_type = reader.u32("MR index"), reader.u32("event type")
        count = reader.u32("digest count")
        if count > _MAX_ALGORITHMS:
            raise ParseError(f"CC event {len(events)} claims {count} digests")
        digests = {}
        for _ in range(count):
            alg = reader.u16("digest algorithm")
            if alg not in sizes:
                raise ParseError(f"CC event {len(events)} uses digest algorithm {alg:#x} the header did not name")
            digests[alg] = reader.take(sizes[alg], "digest")
        size = reader.u32("event size")
        if size > _MAX_EVENT_SIZE:
            raise ParseError(f"CC event {len(events)} claims {size} bytes of data")
        events.append(CcEvent(mr_index, event_type, digests, reader.take(size, "event data")))
    return events


def replay_rtmrs(events: list[CcEvent]) -> tuple[bytes, bytes, bytes, bytes]:
    """RTMR0..3 as the TDX module holds them after every event of the log was extended."""
    rtmrs = [bytes(48)] * RTMR_COUNT
    for number, event in enumerate(events):
        if event.event_type == EV_NO_ACTION:
            continue
        if not 1 <= event.mr_index <= RTMR_COUNT:
            raise ParseError(f"CC event {number} extends MR index {event.mr_index}, not an RTMR (1..4)")
        digest = event.digests.get(SHA384_ALG_ID)
        if digest is None:
            raise ParseError(f"CC event {number} has no SHA-384 digest")
        slot = event.mr_index - 1
        rtmrs[slot] = hashlib.sha384(rtmrs[slot] + digest).digest()
    return rtmrs[0], rtmrs[1], rtmrs[2], rtmrs[3]


def ccel_log_length(acpi_table: bytes) -> int:
    """LAML (log area minimum length) of an ACPI CCEL table: the bytes of the log to read."""
    if len(acpi_table) < 56 or acpi_table[:4] != b"CCEL":
        raise ParseError("not an ACPI CCEL table (signature 'CCEL', 56 bytes)")
    if int.from_bytes(acpi_table[4:8], "little") != len(acpi_table):
        raise ParseError("ACPI CCEL table length does not match its header")
    return int.from_bytes(acpi_table[40:48], "little")
