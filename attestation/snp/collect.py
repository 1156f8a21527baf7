"""Attester side: get an SNP report (and its certificate table) from the guest kernel.

* configfs-tsm (Linux >= 6.7): attestation/tsm.py fetches the report; the certificate table the host
  put in auxblob is parsed here (`parse_cert_table`).
* /dev/sev-guest ioctls SNP_GET_REPORT / SNP_GET_EXT_REPORT (include/uapi/linux/sev-guest.h), the
  device path and the ioctl injectable so tests run on a fake.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import struct
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from attestation.errors import FreshnessError, ParseError, UnsupportedError
from attestation.snp.abi import REPORT_SIZE, parse_report

SEV_GUEST_DEVICE = Path("/dev/sev-guest")
# GHCB spec #56421, "Certificate table" GUIDs (stored little-endian, as the kernel's guid_t).
CERT_GUIDS = {
    "vcek": uuid.UUID("63da758d-e664-4564-adc5-f4b93be8accd"),
    "vlek": uuid.UUID("a8074bc2-a25a-483e-aae6-39c045a0b8a1"),
    "ask": uuid.UUID("4ab7b379-bbac-4fe4-a02f-05aef327c782"),
    "ark": uuid.UUID("c0b406a4-a803-4952-9743-3fb6014cd0ae"),
}
_ENTRY = struct.Struct("<16sII")  # GUID, offset, length


@dataclass(frozen=True)
class Evidence:
    """A raw report with what the host attached (VCEK/VLEK/ASK/ARK by name, unknown GUIDs as str)."""

    report: bytes
    certs: dict[str, bytes] = field(default_factory=dict)
    provider: str = "sev_guest"
    generation: int | None = None


def parse_cert_table(blob: bytes) -> dict[str, bytes]:
    """Entries until the all-zero terminator; offsets are from the start of the table."""
    names = {g.bytes_le: n for n, g in CERT_GUIDS.items()}
    out: dict[str, bytes] = {}
    pos = 0
    while True:
        if pos + _ENTRY.size > len(blob):
            if not blob:
                return out
            raise ParseError("certificate table is not terminated")
        guid, off, length = _ENTRY.unpack_from(blob, pos)
        if guid == bytes(16) and off == 0 and length == 0:
            return out
        if off + length > len(blob):
            raise ParseError("certificate table entry points past its end")
        out[names.get(guid, str(uuid.UUID(bytes_le=guid)))] = blob[off : off + length]
        pos += _ENTRY.size


def encode_cert_table(certs: dict[str, bytes]) -> bytes:
    """Inverse of parse_cert_table (what a host puts in auxblob); used by fakes and tools."""
    items = list(certs.items())
    offset = _ENTRY.size * (len(items) + 1)
    head, body = b"", b""
    for name, data in items:
        guid = CERT_GUIDS[name] if name in CERT_GUIDS else uuid.UUID(name)
        head += _ENTRY.pack(guid.bytes_le, offset + len(body), len(data))
        body += data
    return head + bytes(_ENTRY.size) + body


def _check_report_data(report_data: bytes) -> bytes:
    if len(report_data) > 64:
        raise FreshnessError(f"REPORT_DATA is at most 64 bytes, got {len(report_data)}")
    return report_data.ljust(64, b"\0")  # the rule everywhere here: short values are zero-padded


def _check_outblob(report: bytes, report_data: bytes) -> bytes:
    parsed = parse_report(report)
    if parsed.report_data != report_data:
        raise FreshnessError("the report does not carry the REPORT_DATA that was requested")
    return report


def _iowr(nr: int, size: int) -> int:
    return (3 << 30) | (size << 16) | (ord("S") << 8) | nr


_IOCTL = struct.Struct("<B7xQQQ")  # struct snp_guest_request_ioctl: msg_version, req, resp, exitinfo2
SNP_GET_REPORT = _iowr(0x0, _IOCTL.size)
SNP_GET_EXT_REPORT = _iowr(0x2, _IOCTL.size)
_RESP_SIZE = 4000  # struct snp_report_resp
_MSG_REPORT_RSP = struct.Struct("<II24x")  # status, report_size (Table 25 MSG_REPORT_RSP)
_VMM_ERR_INVALID_LEN = 1
IoctlFn = Callable[[int, int, bytearray], int]


def _req(report_data: bytes, vmpl: int) -> bytes:
    return report_data + struct.pack("<I28x", vmpl)  # struct snp_report_req


def collect_ioctl(
    report_data: bytes,
    *,
    device: Path = SEV_GUEST_DEVICE,
    vmpl: int = 0,
    extended: bool = True,
    ioctl: IoctlFn = fcntl.ioctl,
    certs_size: int = 4 * 4096,
) -> Evidence:
    """SNP_GET_EXT_REPORT (or SNP_GET_REPORT) on /dev/sev-guest; `ioctl` is injectable for tests."""
    data = _check_report_data(report_data)
    try:
        fd = os.open(device, os.O_RDWR)
    except OSError as exc:
        raise UnsupportedError(f"cannot open {device}: {exc}") from exc
    try:
        for _ in range(2):  # the second try uses the certificate size the host asked for
            req = ctypes.create_string_buffer(_req(data, vmpl) + (bytes(16) if extended else b""))
            resp = ctypes.create_string_buffer(_RESP_SIZE)
            certs = ctypes.create_string_buffer(certs_size)
            if extended:
                struct.pack_into("<QI", req, 96, ctypes.addressof(certs), certs_size)
            arg = bytearray(_IOCTL.pack(1, ctypes.addressof(req), ctypes.addressof(resp), 0))
            try:
                ioctl(fd, SNP_GET_EXT_REPORT if extended else SNP_GET_REPORT, arg)
            except OSError as exc:
                exitinfo = _IOCTL.unpack(bytes(arg))[3]
                if extended and exc.errno == errno.EIO and exitinfo >> 32 == _VMM_ERR_INVALID_LEN:
                    certs_size = struct.unpack_from("<I", req, 104)[0]
                    continue
                raise UnsupportedError(f"SNP guest request failed: {exc} (exitinfo2 {exitinfo:#x})") from exc
            status, size = _MSG_REPORT_RSP.unpack_from(resp, 0)
            if status != 0 or size != REPORT_SIZE:
                raise UnsupportedError(f"MSG_REPORT_RSP status {status:#x}, report size {size}")
            report = resp.raw[0x20 : 0x20 + REPORT_SIZE]
            table = parse_cert_table(certs.raw) if extended else {}
            return Evidence(_check_outblob(report, data), table, "sev_guest_ioctl")
        raise UnsupportedError("host kept asking for a larger certificate buffer")
    finally:
        os.close(fd)
