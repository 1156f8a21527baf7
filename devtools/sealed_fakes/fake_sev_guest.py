"""A fake /dev/sev-guest behind the ioctl seam: SNP_GET_REPORT, SNP_GET_EXT_REPORT and
SNP_GET_DERIVED_KEY (MSG_KEY_REQ: a key from a fake chip secret, the launch measurement and policy).

`FakeSevGuest.ioctl` has the signature of `fcntl.ioctl` and works on the same memory as the
kernel driver does: it reads `struct snp_report_req` (and the extended request's certificate
buffer pointer) from the addresses in `struct snp_guest_request_ioctl`, writes the
MSG_REPORT_RSP into the response buffer, and answers a too-small certificate buffer with EIO,
exitinfo2 = SNP_GUEST_VMM_ERR_INVALID_LEN << 32 and the needed size, as the driver does.
`install()` routes `fcntl.ioctl` calls on the fake device's file to it and every other call to
the real one, so an attester in the same process runs unchanged.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import hashlib
import hmac
import os
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

from attestation.snp.abi import REPORT_SIZE
from attestation.snp.collect import SNP_GET_EXT_REPORT, SNP_GET_REPORT
from attestation.snp.derived_key import SNP_GET_DERIVED_KEY

_IOCTL = struct.Struct("<B7xQQQ")
_VMM_ERR_INVALID_LEN = 1
PAGE = 4096


class FakeSevGuest:
    def __init__(self, device: Path, make_report: Callable[[bytes, int], bytes], cert_table: bytes = b"",
                 chip_secret: bytes = b"fake-chip-secret", launch_measurement: bytes = bytes(48)) -> None:
        self.device = device
        self.chip_secret = chip_secret
        self.launch_measurement = launch_measurement
        self.make_report = make_report
        self.cert_table = cert_table
        self.calls = 0
        device.parent.mkdir(parents=True, exist_ok=True)
        device.touch(mode=0o600)

    def _is_ours(self, fd: int) -> bool:
        try:
            return os.readlink(f"/proc/self/fd/{fd}") == str(self.device.resolve())
        except OSError:
            return False

    def router(self, real: Callable[..., Any]) -> Callable[..., Any]:
        """An `fcntl.ioctl` that answers for the fake device's file and passes the rest to `real`."""

        def ioctl(fd: Any, request: int, arg: Any = 0, mutate: bool = True) -> Any:
            if isinstance(fd, int) and self._is_ours(fd):
                return self.ioctl(fd, request, arg)
            return real(fd, request, arg, mutate)

        return ioctl

    def install(self) -> None:
        fcntl.ioctl = self.router(fcntl.ioctl)

    def _derived_key(self, arg: bytearray) -> int:
        """MSG_KEY_REQ: HMAC(chip secret, selected fields), as the firmware mixes them into its KDF."""
        msg_version, req_addr, resp_addr, _ = _IOCTL.unpack(bytes(arg))
        root, _, fields, vmpl, svn, tcb = struct.unpack("<IIQIIQ", ctypes.string_at(req_addr, 32))
        if root != 0 or vmpl > 3:
            raise OSError(errno.EINVAL, "invalid key request")
        mixed = struct.pack("<QIIQ", fields, vmpl, svn, tcb)
        if fields & (1 << 3):
            mixed += self.launch_measurement
        key = hmac.new(self.chip_secret, mixed, hashlib.sha256).digest()
        ctypes.memmove(resp_addr, struct.pack("<I28x", 0) + key, 64)
        arg[:] = _IOCTL.pack(msg_version, req_addr, resp_addr, 0)
        return 0

    def ioctl(self, fd: int, request: int, arg: bytearray) -> int:
        if request == SNP_GET_DERIVED_KEY:
            return self._derived_key(arg)
        if request not in (SNP_GET_REPORT, SNP_GET_EXT_REPORT):
            raise OSError(errno.ENOTTY, "inappropriate ioctl for device")
        self.calls += 1
        msg_version, req_addr, resp_addr, _ = _IOCTL.unpack(bytes(arg))
        if msg_version != 1:
            raise OSError(errno.EINVAL, "unsupported message version")
        extended = request == SNP_GET_EXT_REPORT
        req = ctypes.string_at(req_addr, 96 + (16 if extended else 0))
        report_data, vmpl = req[:64], struct.unpack_from("<I", req, 64)[0]
        if vmpl > 3:
            raise OSError(errno.EINVAL, "invalid VMPL")
        if extended:
            certs_addr, certs_len = struct.unpack_from("<QI", req, 96)
            needed = (len(self.cert_table) + PAGE - 1) // PAGE * PAGE
            if certs_len < len(self.cert_table):
                # The driver writes the needed length back into the request and fails with EIO.
                ctypes.memmove(req_addr + 104, struct.pack("<I", needed), 4)
                arg[:] = _IOCTL.pack(msg_version, req_addr, resp_addr, _VMM_ERR_INVALID_LEN << 32)
                raise OSError(errno.EIO, "certificate buffer too small")
            ctypes.memset(certs_addr, 0, certs_len)
            if self.cert_table:
                ctypes.memmove(certs_addr, self.cert_table, len(self.cert_table))
        report = self.make_report(report_data, vmpl)
        resp = struct.pack("<II24x", 0, REPORT_SIZE) + report
        ctypes.memmove(resp_addr, resp, len(resp))
        arg[:] = _IOCTL.pack(msg_version, req_addr, resp_addr, 0)
        return 0
