"""Test-only CC event logs: a real CCEL capture with one boot event changed, as a host would boot it.

The fake TDX (`FakePlatform.tdx_quote`) signs the RTMRs a log replays to, so a log whose kernel
command-line event differs gives a quote whose RTMR2 differs: what a host that boots the same
firmware with another command line (or kernel, or initrd) produces.
"""

from __future__ import annotations

import hashlib
import struct

from attestation.tdx.eventlog import SHA384_ALG_ID, CcEvent, parse_cc_event_log

EV_IPL = 0x0000000D
CMDLINE_PREFIX = b"kernel_cmdline: "  # GRUB's EV_IPL event; its digest covers only the command line


def _header_length(log: bytes) -> int:
    # TCG_PCR_EVENT: MR index, type, SHA-1 digest, size, then the Spec ID event of that size.
    return 4 + 4 + 20 + 4 + int(struct.unpack_from("<I", log, 28)[0])


def encode_event(event: CcEvent) -> bytes:
    digests = b"".join(struct.pack("<H", alg) + digest for alg, digest in event.digests.items())
    return (struct.pack("<III", event.mr_index, event.event_type, len(event.digests)) + digests
            + struct.pack("<I", len(event.data)) + event.data)


def encode_cc_event_log(header: bytes, events: list[CcEvent]) -> bytes:
    return header + b"".join(encode_event(e) for e in events)


def with_kernel_cmdline(log: bytes, cmdline: str) -> bytes:
    """`log` with its kernel command-line event replaced (data and SHA-384 digest, as GRUB
    measures it): every other event, and so every other RTMR, stays the same."""
    events = parse_cc_event_log(log)
    found = [i for i, e in enumerate(events) if e.event_type == EV_IPL and e.data.startswith(CMDLINE_PREFIX)]
    if len(found) != 1:
        raise ValueError(f"the log has {len(found)} kernel command-line events, expected 1")
    old = events[found[0]]
    text = cmdline.encode()
    events[found[0]] = CcEvent(old.mr_index, old.event_type, {SHA384_ALG_ID: hashlib.sha384(text).digest()},
                               CMDLINE_PREFIX + text + b"\x00")
    out = encode_cc_event_log(log[:_header_length(log)], events)
    # Keep the log area's size and padding (the ACPI CCEL table gives its length).
    return out.ljust(len(log), log[-1:] or b"\xff") if len(out) < len(log) else out


def kernel_cmdline(log: bytes) -> str:
    """The command line a log's GRUB event names (for building a changed one from it)."""
    for e in parse_cc_event_log(log):
        if e.event_type == EV_IPL and e.data.startswith(CMDLINE_PREFIX):
            return e.data[len(CMDLINE_PREFIX):].rstrip(b"\x00").decode()
    raise ValueError("the log has no kernel command-line event")
