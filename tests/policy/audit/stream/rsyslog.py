"""A real rsyslog (the Debian packages `rsyslog` and `rsyslog-openssl`) receiving RFC 5425 syslog
over TLS with its OpenSSL stream driver, writing each message's raw text to a file.

The main queue is Direct: imtcp's session thread runs the file action for what it has read before
it reads on, so by the time rsyslog closes a connection (the forwarder's acknowledgement) every
message of that batch is in the file, and a kill -9 of rsyslog loses nothing it acknowledged (with
its default in-memory queue, messages read but not yet written can be lost; one run of the kill
test without this line happened not to hit that window). Each record starts with a newline: a write that kill -9 tore is
left as a line of its own, never glued to the next message.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

from policy.audit.stream.syslog import BOM
from tests.policy.audit.stream.receivers import Pki, free_port

RSYSLOGD = shutil.which("rsyslogd") or "/usr/sbin/rsyslogd"

CONFIG = """
global(workDirectory="{dir}" maxMessageSize="64k"
       defaultNetstreamDriver="ossl" defaultNetstreamDriverCAFile="{ca}"
       defaultNetstreamDriverCertFile="{cert}" defaultNetstreamDriverKeyFile="{key}")
main_queue(queue.type="Direct")
module(load="imtcp" StreamDriver.Name="ossl" StreamDriver.Mode="1" StreamDriver.AuthMode="anon")
input(type="imtcp" address="127.0.0.1" port="{port}")
template(name="raw" type="string" string="\\n%rawmsg%\\n")
action(type="omfile" file="{out}" template="raw" flushOnTXEnd="on")
"""


def require_rsyslog() -> None:
    """Skip where rsyslogd is not installed; fail instead under SEALED_REQUIRE_RSYSLOG=1 (CI installs
    it, and a skip there would hide the tests)."""
    if Path(RSYSLOGD).exists():
        return
    reason = "rsyslogd is not installed (apt-get install rsyslog rsyslog-openssl)"
    if os.environ.get("SEALED_REQUIRE_RSYSLOG") == "1":
        pytest.fail(f"{reason}; SEALED_REQUIRE_RSYSLOG=1")
    pytest.skip(reason)


class Rsyslog:
    """One rsyslogd on a fixed port; `stop` (SIGTERM), `kill` (SIGKILL) and `start` again keep the
    port and the file it writes, as a SIEM's receiver and its store would."""

    def __init__(self, directory: Path, pki: Pki) -> None:
        self.dir, self.port, self.out = directory, free_port(), directory / "received.log"
        self.conf = directory / "rsyslog.conf"
        self.conf.write_text(CONFIG.format(dir=directory, ca=pki.ca, cert=pki.cert, key=pki.key, port=self.port,
                                           out=self.out))
        self.pidfile = directory / "rsyslogd.pid"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.pidfile.unlink(missing_ok=True)  # a kill -9 leaves it behind
        self.proc = subprocess.Popen([RSYSLOGD, "-n", "-f", str(self.conf), "-i", str(self.pidfile)],
                                     stdout=open(self.dir / "rsyslogd.out", "ab"), stderr=subprocess.STDOUT)  # noqa: SIM115
        deadline = time.monotonic() + 60  # a hang guard: until it listens
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return
            except OSError:
                assert self.proc.poll() is None, (self.dir / "rsyslogd.out").read_text()
                threading.Event().wait(0.05)
        raise TimeoutError("rsyslogd did not listen")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(30)
        self.proc = None

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(30)
        self.proc = None

    def lines(self) -> list[str]:
        """Every non-empty line rsyslog wrote, in order (a torn one included)."""
        text = self.out.read_text("utf-8", errors="replace") if self.out.exists() else ""
        return [line for line in text.splitlines() if line]

    def received(self, count: int) -> list[str]:
        deadline = time.monotonic() + 60
        while True:
            lines = self.lines()
            if len(lines) >= count or not time.monotonic() < deadline:
                return lines
            threading.Event().wait(0.05)


def raw_entry(line: str) -> str | None:
    """The signed entry a syslog message carries (OCSF raw_data), or None for a line that is not a
    whole message (one a kill -9 tore mid-write: unacknowledged, so the forwarder sent it again)."""
    _, sep, body = line.encode("utf-8").partition(BOM)
    if not sep:
        return None
    try:
        return str(json.loads(body)["raw_data"])
    except (ValueError, KeyError, TypeError):
        return None
