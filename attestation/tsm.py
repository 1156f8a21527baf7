"""Client for the Linux configfs-tsm report interface (Documentation/ABI/testing/configfs-tsm).

Both SEV-SNP and TDX guests expose attestation reports through the same kernel ABI: make a
directory under /sys/kernel/config/tsm/report, write REPORT_DATA to `inblob`, read the signed
report from `outblob`. `generation` counts writes to the entry, so a concurrent writer that
changed `inblob` between our write and our read is detected and refused (the report would bind
someone else's REPORT_DATA).

The file-system operations go through `ConfigfsOps`, so tests and the simulated TEE can drive the
same client against an ordinary directory (`DirectoryConfigfsFake`).
"""

from __future__ import annotations

import errno
import os
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from attestation.errors import AttestationError, FreshnessError, UnsupportedError

DEFAULT_BASE = Path("/sys/kernel/config/tsm/report")
INBLOB_MAX = 64  # TSM_INBLOB_MAX in include/linux/tsm.h
PRIVLEVEL_MAX = 3  # TSM_PRIVLEVEL_MAX: SNP VMPL 0..3; TDX accepts only 0


@dataclass(frozen=True)
class TsmReport:
    outblob: bytes
    auxblob: bytes | None  # SNP: certificate table; TDX: absent
    provider: str  # "tdx_guest", "sev_guest", ...
    generation: int


class ConfigfsOps(Protocol):
    def mkdir(self, path: Path) -> None: ...
    def rmdir(self, path: Path) -> None: ...
    def write(self, path: Path, data: bytes) -> None: ...
    def read(self, path: Path) -> bytes: ...


class OsConfigfsOps:
    """The real configfs: plain syscalls. rmdir removes the entry together with its attributes."""

    def mkdir(self, path: Path) -> None:
        os.mkdir(path, 0o700)

    def rmdir(self, path: Path) -> None:
        os.rmdir(path)

    def write(self, path: Path, data: bytes) -> None:
        # One write(2) call: configfs binary attributes take the whole value at once.
        fd = os.open(path, os.O_WRONLY)
        try:
            if os.write(fd, data) != len(data):
                raise AttestationError(f"short write to {path}")
        finally:
            os.close(fd)

    def read(self, path: Path) -> bytes:
        return path.read_bytes()


class TsmReportClient:
    """Fetch one report per call from a fresh configfs-tsm entry, removed afterwards."""

    def __init__(self, base: Path = DEFAULT_BASE, *, ops: ConfigfsOps | None = None, entry: str | None = None) -> None:
        self.base = base
        self.ops: ConfigfsOps = ops or OsConfigfsOps()
        # An entry made beforehand (by init, or a fake tree) is used as it is and left in place;
        # otherwise each report gets a fresh entry that is removed afterwards.
        self.entry = entry

    def available(self) -> bool:
        return self.base.is_dir()

    def get_report(self, report_data: bytes, privlevel: int | None = None) -> TsmReport:
        if not 0 < len(report_data) <= INBLOB_MAX:
            raise ValueError(f"report_data must be 1..{INBLOB_MAX} bytes, got {len(report_data)}")
        if privlevel is not None and not 0 <= privlevel <= PRIVLEVEL_MAX:
            raise ValueError(f"privlevel must be 0..{PRIVLEVEL_MAX}")
        if not self.available():
            raise UnsupportedError(f"configfs-tsm not available at {self.base} (no TEE guest driver?)")
        if self.entry is not None:
            if "/" in self.entry or self.entry in ("", ".", ".."):
                raise ValueError("configfs-tsm entry must be a plain directory name")
            return self._fetch(self.base / self.entry, report_data, privlevel)
        # A random entry name: two processes never share an entry, so neither sees the other's inblob.
        entry = self.base / f"sealed-{os.getpid()}-{secrets.token_hex(8)}"
        try:
            self.ops.mkdir(entry)
        except OSError as exc:
            raise UnsupportedError(f"cannot create configfs-tsm entry {entry}: {exc}") from exc
        try:
            return self._fetch(entry, report_data, privlevel)
        finally:
            try:
                self.ops.rmdir(entry)
            except OSError as exc:
                if exc.errno != errno.ENOENT:
                    raise AttestationError(f"cannot remove configfs-tsm entry {entry}: {exc}") from exc

    def _fetch(self, entry: Path, report_data: bytes, privlevel: int | None) -> TsmReport:
        start = self._generation(entry)
        writes = 0
        try:
            if privlevel is not None:
                self.ops.write(entry / "privlevel", str(privlevel).encode())
                writes += 1
            self.ops.write(entry / "inblob", report_data)
            writes += 1
        except OSError as exc:
            raise AttestationError(f"cannot configure configfs-tsm entry: {exc}") from exc
        # Every write bumps `generation` once; anything else means another writer touched the entry.
        configured = self._generation(entry)
        if configured != start + writes:
            raise FreshnessError(f"configfs-tsm generation raced: want {start + writes}, got {configured}")
        try:
            outblob = self.ops.read(entry / "outblob")
        except OSError as exc:
            raise AttestationError(f"configfs-tsm outblob read failed: {exc}") from exc
        auxblob = self._read_optional(entry / "auxblob")
        provider = self._read_optional(entry / "provider")
        after = self._generation(entry)
        # Re-checked after reading: a write during the read would make outblob someone else's report.
        if after != configured:
            raise FreshnessError(f"configfs-tsm generation changed while reading ({configured} -> {after})")
        if not outblob:
            raise AttestationError("configfs-tsm returned an empty outblob")
        return TsmReport(
            outblob=outblob,
            auxblob=auxblob or None,
            provider=(provider or b"").decode("ascii", "replace").strip(),
            generation=after,
        )

    def _generation(self, entry: Path) -> int:
        try:
            return int(self.ops.read(entry / "generation").strip() or b"0")
        except (OSError, ValueError) as exc:
            raise AttestationError(f"configfs-tsm generation unreadable: {exc}") from exc

    def _read_optional(self, path: Path) -> bytes | None:
        # auxblob is absent for TDX and empty when the host supplied no certificates.
        try:
            return self.ops.read(path)
        except OSError:
            return None


ReportMaker = Callable[[bytes, int], bytes]


class DirectoryConfigfsFake:
    """Plays the kernel's part on an ordinary directory, for tests and the simulated TEE.

    Writing `inblob`/`privlevel` bumps `generation` and regenerates `outblob` via `make_report`
    (called with the 64-byte zero-padded inblob and the privlevel), like the tsm core does.
    """

    def __init__(self, make_report: ReportMaker, provider: str, auxblob: bytes | None = None) -> None:
        self.make_report = make_report
        self.provider = provider
        self.auxblob = auxblob
        self.on_read: Callable[[Path], None] | None = None  # test hook, e.g. to simulate a race

    def mkdir(self, path: Path) -> None:
        path.mkdir(mode=0o700)
        (path / "generation").write_bytes(b"0\n")
        (path / "provider").write_bytes(self.provider.encode() + b"\n")
        (path / "privlevel").write_bytes(b"0\n")
        if self.auxblob is not None:
            (path / "auxblob").write_bytes(self.auxblob)

    def rmdir(self, path: Path) -> None:
        for child in path.iterdir():
            child.unlink()
        path.rmdir()

    def write(self, path: Path, data: bytes) -> None:
        entry = path.parent
        if path.name == "inblob" and len(data) > INBLOB_MAX:
            raise OSError(errno.EINVAL, "inblob too large")
        path.write_bytes(data)
        gen = int((entry / "generation").read_bytes()) + 1
        (entry / "generation").write_bytes(f"{gen}\n".encode())
        inblob = (entry / "inblob").read_bytes() if (entry / "inblob").exists() else b""
        privlevel = int((entry / "privlevel").read_bytes())
        (entry / "outblob").write_bytes(self.make_report(inblob.ljust(INBLOB_MAX, b"\0"), privlevel))

    def read(self, path: Path) -> bytes:
        if self.on_read is not None:
            self.on_read(path)
        return path.read_bytes()
