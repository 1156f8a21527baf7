"""SEV-SNP sealing key: MSG_KEY_REQ through /dev/sev-guest (SNP_GET_DERIVED_KEY).

The firmware derives the key from the chip's VCEK secret (root_key_select 0), mixing in the guest
policy and the launch measurement (guest_field_select bits 0 and 3, SEV-SNP ABI spec, "MSG_KEY_REQ"):
the same measured broker on the same chip gets the same key after a restart; another image, another
policy or another chip gets another one; the host never sees it. The ioctl is the seam the fake
device (devtools/sealed_fakes/fake_sev_guest.py) stands in for.
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import struct
from pathlib import Path

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from attestation.errors import SealingError
from attestation.snp.collect import _IOCTL, SEV_GUEST_DEVICE, IoctlFn, _iowr

SNP_GET_DERIVED_KEY = _iowr(0x1, _IOCTL.size)
_KEY_REQ = struct.Struct("<IIQIIQ")  # root_key_select, rsvd, guest_field_select, vmpl, guest_svn, tcb_version
_KEY_RSP = struct.Struct("<I28x32s")  # status, reserved, derived key (struct snp_derived_key_resp: 64 bytes)
FIELD_POLICY = 1 << 0
FIELD_MEASUREMENT = 1 << 3


def request_derived_key(*, device: Path = SEV_GUEST_DEVICE, vmpl: int = 0,
                        field_select: int = FIELD_POLICY | FIELD_MEASUREMENT, ioctl: IoctlFn | None = None) -> bytes:
    """32 bytes from the firmware, bound to this guest's policy and launch measurement."""
    try:
        fd = os.open(device, os.O_RDWR)
    except OSError as exc:
        raise SealingError(f"no SNP derived key: cannot open {device}: {exc}") from exc
    try:
        req = ctypes.create_string_buffer(_KEY_REQ.pack(0, 0, field_select, vmpl, 0, 0))
        resp = ctypes.create_string_buffer(64)
        arg = bytearray(_IOCTL.pack(1, ctypes.addressof(req), ctypes.addressof(resp), 0))
        try:
            # fcntl.ioctl is looked up now, not at import: the ioctl is the seam a fake device replaces.
            (ioctl or fcntl.ioctl)(fd, SNP_GET_DERIVED_KEY, arg)
        except OSError as exc:
            raise SealingError(f"SNP MSG_KEY_REQ failed: {exc}") from exc
        status, key = _KEY_RSP.unpack_from(resp.raw, 0)
        if status != 0:
            raise SealingError(f"MSG_KEY_RSP status {status:#x}")
        return bytes(key)
    finally:
        os.close(fd)


class SnpDerivedKey:
    """A sealing key source (attestation.sealing) over the firmware key; `measurement` is the launch
    measurement of this guest's own report (named in each sealed blob)."""

    tee = "snp"

    def __init__(self, measurement: bytes, *, device: Path = SEV_GUEST_DEVICE) -> None:
        self.measurement = measurement
        self._root = request_derived_key(device=device)

    def derive(self, label: bytes) -> bytes:
        return HKDF(algorithm=hashes.SHA256(), length=32, salt=None,
                    info=b"sealed-snp-sealing-key-v1\x00" + label).derive(self._root)
