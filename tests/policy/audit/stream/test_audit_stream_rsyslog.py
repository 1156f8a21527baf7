"""Audit forwarding to a real rsyslog (the Debian package) over TLS (its OpenSSL stream driver),
octet-counted frames: every entry arrives in order, the chain verifies from what rsyslog wrote, a
receiver restart loses nothing, and a forwarder that does not trust rsyslog's certificate sends nothing."""

from __future__ import annotations

import json
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from policy.audit.stream.errors import DeliveryError
from policy.audit.stream.forwarder import Forwarder, ForwardSettings
from policy.audit.stream.syslog import BOM, SyslogSender, SyslogTarget
from tests.policy.audit.stream.helpers import check_received, no_canary, write_entries
from tests.policy.audit.stream.receivers import Pki, free_port, make_pki

RSYSLOGD = shutil.which("rsyslogd") or "/usr/sbin/rsyslogd"

CONFIG = """
global(workDirectory="{dir}" maxMessageSize="64k"
       defaultNetstreamDriver="ossl" defaultNetstreamDriverCAFile="{ca}"
       defaultNetstreamDriverCertFile="{cert}" defaultNetstreamDriverKeyFile="{key}")
module(load="imtcp" StreamDriver.Name="ossl" StreamDriver.Mode="1" StreamDriver.AuthMode="anon")
input(type="imtcp" address="127.0.0.1" port="{port}")
template(name="raw" type="string" string="%rawmsg%\\n")
action(type="omfile" file="{out}" template="raw")
"""


class Rsyslog:
    def __init__(self, directory: Path, pki: Pki) -> None:
        self.dir, self.port, self.out = directory, free_port(), directory / "received.log"
        self.conf = directory / "rsyslog.conf"
        self.conf.write_text(CONFIG.format(dir=directory, ca=pki.ca, cert=pki.cert, key=pki.key, port=self.port,
                                           out=self.out))
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen([RSYSLOGD, "-n", "-f", str(self.conf), "-i", str(self.dir / "rsyslogd.pid")],
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
            self.proc.send_signal(signal.SIGTERM)  # flushes what it received
            self.proc.wait(30)
        self.proc = None

    def received(self, count: int) -> list[str]:
        deadline = time.monotonic() + 60
        while True:
            lines = self.out.read_text().splitlines() if self.out.exists() else []
            if len(lines) >= count or not time.monotonic() < deadline:
                return lines
            threading.Event().wait(0.05)


@pytest.fixture
def rsyslog(tmp_path: Path) -> Iterator[tuple[Rsyslog, Pki]]:
    if not Path(RSYSLOGD).exists():
        pytest.skip("rsyslogd is not installed (apt-get install rsyslog rsyslog-openssl)")
    pki = make_pki(tmp_path / "pki")
    server = Rsyslog(tmp_path, pki)
    server.start()
    yield server, pki
    server.stop()


def _raw(lines: list[str]) -> list[str]:
    return [json.loads(line.encode().split(BOM, 1)[1])["raw_data"] for line in lines]


def test_rsyslog_receives_every_entry_in_order_across_its_own_restart(tmp_path: Path,
                                                                    rsyslog: tuple[Rsyslog, Pki]) -> None:
    server, pki = rsyslog
    write_entries(tmp_path / "audit", "gateway", 40)
    forwarder = Forwarder(ForwardSettings(tmp_path / "audit", tmp_path / "state", batch=16),
                          SyslogSender(SyslogTarget("localhost", server.port, pki.ca, hostname="gw-1")))
    assert forwarder.pump() == 40
    assert len(server.received(40)) == 40
    server.stop()
    write_entries(tmp_path / "audit", "gateway", 25, start=40)
    with pytest.raises(DeliveryError):
        forwarder.pump()
    server.start()
    assert forwarder.pump() == 25
    lines = server.received(65)
    check_received(_raw(lines), 65)
    assert all(" gw-1 sealed-gateway - key.release [sealed@32473 uid=" in line for line in lines)
    no_canary(server.out.read_bytes())


def test_a_forwarder_that_does_not_trust_rsyslogs_certificate_sends_nothing(
        tmp_path: Path, rsyslog: tuple[Rsyslog, Pki]) -> None:
    server, _ = rsyslog
    other = make_pki(tmp_path / "other", ca_name="not the SIEM's CA")
    write_entries(tmp_path / "audit", "gateway", 3)
    forwarder = Forwarder(ForwardSettings(tmp_path / "audit", tmp_path / "state"),
                          SyslogSender(SyslogTarget("localhost", server.port, other.ca)))
    with pytest.raises(DeliveryError, match="not trusted"):
        forwarder.pump()
    assert not server.out.exists() or server.out.read_text() == ""
