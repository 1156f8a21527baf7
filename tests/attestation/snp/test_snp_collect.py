"""Attester side: the certificate table, /dev/sev-guest ioctls through a fake ioctl (configfs-tsm:
attestation/tsm.py, tests/attestation/tdx/test_tsm.py), and on hardware a real report."""

from __future__ import annotations

import ctypes
import dataclasses
import datetime as dt
import errno
import os
import struct
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization

from attestation.errors import ParseError, UnsupportedError
from attestation.snp import encode_report, parse_report, verify_report
from attestation.snp.collect import (
    SNP_GET_EXT_REPORT,
    SNP_GET_REPORT,
    collect_ioctl,
    encode_cert_table,
    parse_cert_table,
)
from attestation.snp.tcb import Product
from attestation.tsm import TsmReportClient
from sealed_fakes.snp_pki import EPOCH, AmdTestPki, KeySet, sign_report, template_report

DER = serialization.Encoding.DER


def test_cert_table_roundtrip() -> None:
    certs = {"vcek": b"v" * 10, "ask": b"a" * 3, "ark": b"r", "0a0b0c0d-0000-0000-0000-000000000001": b"x"}
    table = encode_cert_table(certs)
    assert parse_cert_table(table) == certs
    assert parse_cert_table(b"") == {}
    with pytest.raises(ParseError):
        parse_cert_table(table[:30])
    bad = bytearray(table)
    bad[20:24] = (10_000).to_bytes(4, "little")
    with pytest.raises(ParseError):
        parse_cert_table(bytes(bad))


class FakeSevGuest:
    """Plays the kernel: reads snp_report_req via its address, writes MSG_REPORT_RSP and certs."""

    def __init__(self, pki: AmdTestPki, keys: KeySet, table: bytes, short_first: bool) -> None:
        self.pki, self.keys, self.table, self.short_first = pki, keys, table, short_first
        self.calls: list[int] = []

    def __call__(self, fd: int, request: int, arg: bytearray) -> int:
        self.calls.append(request)
        _, req_addr, resp_addr, _ = struct.unpack("<B7xQQQ", bytes(arg))
        user_data = ctypes.string_at(req_addr, 64)
        vmpl = struct.unpack("<I", ctypes.string_at(req_addr + 64, 4))[0]
        if request == SNP_GET_EXT_REPORT:
            certs_addr, certs_len = struct.unpack("<QI", ctypes.string_at(req_addr + 96, 12))
            if self.short_first and len(self.calls) == 1:
                ctypes.memmove(req_addr + 104, struct.pack("<I", 8192), 4)
                arg[24:32] = (1 << 32).to_bytes(8, "little")  # SNP_GUEST_VMM_ERR_INVALID_LEN
                raise OSError(errno.EIO, "certificate buffer too small")
            assert certs_len >= len(self.table)
            ctypes.memmove(certs_addr, self.table, len(self.table))
        report = template_report(3, Product.MILAN, report_data=user_data, vmpl=vmpl)
        resp = struct.pack("<II24x", 0, 0x4A0) + sign_report(report, self.keys.vek)
        ctypes.memmove(resp_addr, resp, len(resp))
        return 0


@pytest.mark.parametrize("short_first", [False, True])
def test_ioctl_ext_report(
    tmp_path: Path,
    pkis: dict[Product, AmdTestPki],
    test_keys: KeySet,
    roots_dir: Path,
    short_first: bool,
) -> None:
    pki = pkis[Product.MILAN]
    rep = template_report(3, Product.MILAN)
    vek = pki.make_vek(rep.tcb("reported", Product.MILAN), rep.chip_id).public_bytes(DER)
    fake = FakeSevGuest(pki, test_keys, encode_cert_table({"vcek": vek}), short_first)
    device = tmp_path / "sev-guest"
    device.write_bytes(b"")
    nonce = os.urandom(64)
    ev = collect_ioctl(nonce, device=device, ioctl=fake, certs_size=16 if short_first else 16384)
    assert fake.calls == [SNP_GET_EXT_REPORT] * (2 if short_first else 1)
    vr = verify_report(
        ev.report, certs=[ev.certs["vcek"]], now=EPOCH + dt.timedelta(days=1), roots_dir=roots_dir
    )
    assert vr.report.report_data == nonce


def test_ioctl_plain_report_and_errors(
    tmp_path: Path, pkis: dict[Product, AmdTestPki], test_keys: KeySet
) -> None:
    fake = FakeSevGuest(pkis[Product.MILAN], test_keys, b"", False)
    device = tmp_path / "sev-guest"
    device.write_bytes(b"")
    ev = collect_ioctl(b"abc", device=device, ioctl=fake, extended=False, vmpl=2)
    assert fake.calls == [SNP_GET_REPORT] and ev.certs == {}
    assert ev.report[0x30] == 2 and ev.report[0x50:0x53] == b"abc"
    with pytest.raises(UnsupportedError, match="cannot open"):
        collect_ioctl(b"abc", device=tmp_path / "absent")

    def failing(fd: int, request: int, arg: bytearray) -> int:
        raise OSError(errno.EINVAL, "bad")

    with pytest.raises(UnsupportedError, match="guest request failed"):
        collect_ioctl(b"abc", device=device, ioctl=failing)


@pytest.mark.parametrize("version", [2, 3, 5])
@pytest.mark.parametrize("product", list(Product))
def test_encode_parse_roundtrip(version: int, product: Product, test_keys: KeySet) -> None:
    raw = sign_report(template_report(version, product, guest_svn=9), test_keys.vek)
    parsed = parse_report(raw)
    assert encode_report(parsed) == raw
    assert dataclasses.replace(parsed, raw=b"") == parsed  # raw bytes do not take part in equality


@pytest.mark.tee
def test_real_configfs_report() -> None:
    """On SEV-SNP hardware: a real report through configfs-tsm, verified against the pinned roots."""
    nonce = os.urandom(64)
    try:
        tsm = TsmReportClient().get_report(nonce)
    except UnsupportedError as exc:
        pytest.skip(str(exc))
    if tsm.provider != "sev_guest":  # e.g. a TDX host running the tee suite
        pytest.skip(f"configfs-tsm provider is {tsm.provider}")
    certs = list(parse_cert_table(tsm.auxblob or b"").values())
    if not certs:
        pytest.skip("host supplied no certificates (fetch the VCEK from KDS to verify)")
    vr = verify_report(tsm.outblob, certs=certs, now=dt.datetime.now(dt.UTC))
    assert vr.report.report_data == nonce
