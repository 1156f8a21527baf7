"""Audit forwarding to a real rsyslog (the Debian package) over TLS (its OpenSSL stream driver),
octet-counted frames: every entry arrives in order, the chain verifies from what rsyslog wrote, a
receiver restart loses nothing, and a forwarder that does not trust rsyslog's certificate sends nothing."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from policy.audit.stream.errors import DeliveryError
from policy.audit.stream.forwarder import Forwarder, ForwardSettings
from policy.audit.stream.syslog import SyslogSender, SyslogTarget
from tests.policy.audit.stream.helpers import check_received, no_canary, write_entries
from tests.policy.audit.stream.receivers import Pki, make_pki
from tests.policy.audit.stream.rsyslog import Rsyslog, raw_entry, require_rsyslog


@pytest.fixture
def rsyslog(tmp_path: Path) -> Iterator[tuple[Rsyslog, Pki]]:
    require_rsyslog()
    pki = make_pki(tmp_path / "pki")
    server = Rsyslog(tmp_path, pki)
    server.start()
    yield server, pki
    server.stop()


def _raw(lines: list[str]) -> list[str]:
    return [raw for raw in map(raw_entry, lines) if raw is not None]


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
