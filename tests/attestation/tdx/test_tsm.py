"""configfs-tsm client against a directory that plays the kernel's part."""

from __future__ import annotations

from pathlib import Path

import pytest

from attestation.errors import FreshnessError, UnsupportedError
from attestation.tsm import DirectoryConfigfsFake, TsmReportClient


def _echo(inblob: bytes, privlevel: int) -> bytes:
    return b"REPORT" + bytes([privlevel]) + inblob


def _client(tmp_path: Path, **kw: object) -> tuple[TsmReportClient, DirectoryConfigfsFake]:
    fake = DirectoryConfigfsFake(_echo, "tdx_guest", **kw)  # type: ignore[arg-type]
    return TsmReportClient(tmp_path, ops=fake), fake


def test_report_roundtrip_and_entry_removed(tmp_path: Path) -> None:
    client, _ = _client(tmp_path)
    rep = client.get_report(b"\x11" * 64)
    assert rep.outblob == b"REPORT\x00" + b"\x11" * 64
    assert rep.provider == "tdx_guest"
    assert rep.auxblob is None
    assert rep.generation == 1
    assert list(tmp_path.iterdir()) == []


def test_privlevel_and_auxblob(tmp_path: Path) -> None:
    client, _ = _client(tmp_path, auxblob=b"certs")
    rep = client.get_report(b"ab", privlevel=2)
    assert rep.outblob == b"REPORT\x02" + b"ab" + b"\0" * 62
    assert rep.auxblob == b"certs"
    assert rep.generation == 2


def test_fresh_entry_each_call(tmp_path: Path) -> None:
    client, fake = _client(tmp_path)
    seen: set[Path] = set()
    fake.on_read = lambda p: seen.add(p.parent)
    client.get_report(b"a")
    client.get_report(b"b")
    assert len(seen) == 2


def test_race_detected_and_entry_removed(tmp_path: Path) -> None:
    client, fake = _client(tmp_path)

    def intruder(path: Path) -> None:
        if path.name == "outblob":
            fake.write(path.parent / "inblob", b"evil")

    fake.on_read = intruder
    with pytest.raises(FreshnessError):
        client.get_report(b"\x01" * 64)
    assert list(tmp_path.iterdir()) == []


def test_missing_configfs(tmp_path: Path) -> None:
    with pytest.raises(UnsupportedError):
        TsmReportClient(tmp_path / "absent").get_report(b"x")


@pytest.mark.parametrize("data", [b"", b"x" * 65])
def test_bad_report_data(tmp_path: Path, data: bytes) -> None:
    client, _ = _client(tmp_path)
    with pytest.raises(ValueError):
        client.get_report(data)
