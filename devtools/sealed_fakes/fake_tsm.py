"""A fake configfs-tsm report tree: a directory of named pipes plus a thread playing the kernel.

On a real guest, /sys/kernel/config/tsm/report/<entry>/ holds attribute files; writing `inblob`
bumps `generation`, and reading `outblob` makes the TEE produce a report over the current inblob.
Here each attribute is a FIFO: the attester's ordinary open/write/read calls block until the
thread answers, exactly like the kernel's attribute handlers, so the attester runs its real code
against it (no injected file operations). One attester process at a time, reading attributes one
after another, as the kernel's per-entry lock serialises them. Reports come from `make_report(inblob64, privlevel)`,
e.g. a report signed by a test PKI (`sealed_fakes.platform`).

The entry is created up front (on a real guest, init or the attester's own mkdir does it); an
attester is pointed at it by name.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import threading
import time
from collections.abc import Callable
from pathlib import Path

INBLOB_MAX = 64
ReportMaker = Callable[[bytes, int], tuple[bytes, bytes | None]]  # -> (outblob, auxblob or None)
_INPUTS = ("inblob", "privlevel")
_OUTPUTS = ("generation", "provider", "outblob", "auxblob")


class FakeTsmTree:
    def __init__(self, base: Path, provider: str, make_report: ReportMaker, *, entry: str = "sealed",
                 poll_s: float = 0.002) -> None:
        self.base = base
        self.entry = base / entry
        self.provider = provider
        self.make_report = make_report
        self.poll_s = poll_s
        self.generation = 0
        self.inblob = b""
        self.privlevel = 0
        self.reports = 0  # how many reports the "TEE" produced (tests check it answered)
        self._cache: tuple[int, bytes, bytes | None] | None = None
        self._inputs: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> FakeTsmTree:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        self.entry.mkdir(parents=True, exist_ok=True, mode=0o700)
        for name in (*_INPUTS, *_OUTPUTS):
            path = self.entry / name
            if path.exists() and not stat.S_ISFIFO(path.stat().st_mode):
                path.unlink()
            if not path.exists():
                os.mkfifo(path, 0o600)
        for name in _INPUTS:
            self._inputs[name] = os.open(self.entry / name, os.O_RDONLY | os.O_NONBLOCK)
        self._thread = threading.Thread(target=self._run, name="fake-configfs-tsm", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        for fd in self._inputs.values():
            os.close(fd)
        self._inputs.clear()

    @staticmethod
    def _renew(path: Path) -> None:
        fresh = path.with_name(f".{path.name}.next")
        with contextlib.suppress(FileNotFoundError):
            fresh.unlink()
        os.mkfifo(fresh, 0o600)
        os.replace(fresh, path)  # atomic: an open of `path` finds the old FIFO or the new one, never none

    # ---- the kernel's part ----------------------------------------------------------------
    def _drain(self) -> None:
        """Apply every completed write; a write always lands before the writer's next open."""
        for name, fd in self._inputs.items():
            while True:
                try:
                    data = os.read(fd, 4096)
                except BlockingIOError:
                    break
                if not data:
                    break
                if name == "inblob":
                    if len(data) > INBLOB_MAX:
                        continue  # the kernel answers EINVAL; the attester's check catches it first
                    self.inblob = data
                else:
                    self.privlevel = int(data.strip() or b"0")
                self.generation += 1

    def _report(self) -> tuple[bytes, bytes | None]:
        if self._cache is None or self._cache[0] != self.generation:
            outblob, auxblob = self.make_report(self.inblob.ljust(INBLOB_MAX, b"\0"), self.privlevel)
            self.reports += 1
            self._cache = (self.generation, outblob, auxblob)
        return self._cache[1], self._cache[2]

    def _value(self, name: str) -> bytes:
        if name == "generation":
            return f"{self.generation}\n".encode()
        if name == "provider":
            return f"{self.provider}\n".encode()
        outblob, auxblob = self._report()
        return outblob if name == "outblob" else (auxblob or b"")

    def _run(self) -> None:
        while not self._stop.is_set():
            self._drain()
            served = False
            for name in _OUTPUTS:
                path = self.entry / name
                try:
                    fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
                except OSError as exc:
                    if exc.errno in (errno.ENXIO, errno.ENOENT):
                        continue  # nobody is reading this attribute now
                    raise
                try:
                    self._drain()  # whatever the reader wrote before opening is in the pipe now
                    os.set_blocking(fd, True)
                    data = memoryview(self._value(name))
                    while data:
                        data = data[os.write(fd, data):]
                except BrokenPipeError:
                    pass
                finally:
                    # Before this answer ends (EOF on close), the name moves to a new FIFO: the reader
                    # drains the old one, which nobody opens again, so the next open of the name, for
                    # the next report, waits for a new answer and can never see this one twice. (It
                    # used to be "never answer the same name twice in a row": a second report's first
                    # read of `generation` then waited forever.)
                    self._renew(path)
                    with contextlib.suppress(OSError):
                        os.close(fd)
                served = True
            if not served:
                time.sleep(self.poll_s)
