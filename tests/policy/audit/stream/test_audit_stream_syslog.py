"""Audit forwarding to a real RFC 5425 syslog-over-TLS receiver in the test."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from policy.audit.stream.errors import DeliveryError, StreamConfigError
from policy.audit.stream.forwarder import Forwarder, ForwardSettings
from policy.audit.stream.syslog import BOM, SyslogSender, SyslogTarget
from tests.policy.audit.stream.helpers import CANARY, check_received, no_canary, write_entries
from tests.policy.audit.stream.receivers import SyslogServer, free_port, make_pki

HEADER = re.compile(rb"^<(\d+)>1 (\S+) (\S+) (\S+) (\S+) (\S+) (\[sealed@32473 [^\]]*\]) $")


def _raw(messages: list[bytes]) -> list[str]:
    return [json.loads(m.split(BOM, 1)[1])["raw_data"] for m in messages]


def _forwarder(tmp_path: Path, target: SyslogTarget, batch: int = 7) -> Forwarder:
    return Forwarder(ForwardSettings(tmp_path / "audit", tmp_path / "state", batch=batch), SyslogSender(target))


def test_entries_arrive_in_order_as_rfc5424_octet_counted_ocsf(tmp_path: Path) -> None:
    pki = make_pki(tmp_path / "pki")
    server = SyslogServer(pki)
    write_entries(tmp_path / "audit", "gateway", 20)
    forwarder = _forwarder(tmp_path, SyslogTarget("localhost", server.port, pki.ca, hostname="gw-1"))
    assert forwarder.pump() == 20
    messages = server.wait_for(20)
    assert len(messages) == 20
    check_received(_raw(messages), 20)
    for seq, message in enumerate(messages):
        header, _, body = message.partition(BOM)
        match = HEADER.match(header)
        assert match is not None, header
        pri, _ts, host, app, _procid, msgid, sd = match.groups()
        assert (host, app, msgid) == (b"gw-1", b"sealed-gateway", b"key.release")
        assert int(pri) == 13 * 8 + (6 if seq % 2 else 4)  # log audit; info for allow, warning for deny
        event = json.loads(body)
        assert event["class_uid"] == 6003 and event["metadata"]["sequence"] == seq
        assert f'uid="{event["metadata"]["uid"]}"'.encode() in sd
    no_canary(b"".join(messages))
    assert forwarder.pump() == 0  # the cursor holds: nothing is sent twice on a quiet log
    server.close()


def test_a_receiver_with_an_untrusted_certificate_is_refused_and_nothing_advances(tmp_path: Path) -> None:
    trusted = make_pki(tmp_path / "trusted", ca_name="the SIEM's CA")
    impostor = make_pki(tmp_path / "impostor", ca_name="someone else's CA")
    server = SyslogServer(impostor)
    write_entries(tmp_path / "audit", "key-broker", 3)
    forwarder = _forwarder(tmp_path, SyslogTarget("localhost", server.port, trusted.ca))
    with pytest.raises(DeliveryError, match="not trusted"):
        forwarder.pump()
    assert server.messages == []
    assert forwarder.cursor.position("key-broker.audit.jsonl").seq == 0
    server.close()


def test_a_certificate_for_another_host_name_is_refused(tmp_path: Path) -> None:
    pki = make_pki(tmp_path / "pki", host="siem.example")  # valid chain, wrong name
    server = SyslogServer(pki)
    write_entries(tmp_path / "audit", "gateway", 1)
    with pytest.raises(DeliveryError, match="not trusted"):
        _forwarder(tmp_path, SyslogTarget("localhost", server.port, pki.ca)).pump()
    server.close()


def test_a_bare_close_after_reading_is_no_receipt_and_the_batch_is_sent_again(tmp_path: Path) -> None:
    """A receiver killed after reading a batch into memory, before storing it, closes with a plain
    FIN (the kernel resets only while bytes are unread). Only its close_notify counts as a receipt."""
    pki = make_pki(tmp_path / "pki")
    server = SyslogServer(pki, dies_after_reading=True)
    write_entries(tmp_path / "audit", "gateway", 5)
    forwarder = _forwarder(tmp_path, SyslogTarget("localhost", server.port, pki.ca), batch=5)
    with pytest.raises(DeliveryError, match="without its TLS close_notify"):
        forwarder.pump()
    assert server.messages == []
    assert forwarder.cursor.position("gateway.audit.jsonl").seq == 0
    server.dies_after_reading = False  # back up, and storing what it reads
    assert forwarder.pump() == 5
    check_received(_raw(server.wait_for(5)), 5)
    server.close()


def test_a_receiver_that_is_down_then_up_gets_everything_once_it_is_back(tmp_path: Path) -> None:
    pki = make_pki(tmp_path / "pki")
    port = free_port()
    write_entries(tmp_path / "audit", "gateway", 10)
    forwarder = _forwarder(tmp_path, SyslogTarget("localhost", port, pki.ca), batch=4)
    with pytest.raises(DeliveryError):
        forwarder.pump()
    assert forwarder.cursor.position("gateway.audit.jsonl").seq == 0
    server = SyslogServer(pki, port=port)
    assert forwarder.pump() == 10
    check_received(_raw(server.wait_for(10)), 10)
    server.close()


def test_syslog_settings_refuse_plaintext_and_half_a_client_identity(tmp_path: Path) -> None:
    pki = make_pki(tmp_path / "pki")
    with pytest.raises(StreamConfigError, match="TLS is required"):
        SyslogTarget("localhost", 6514, tmp_path / "missing-ca.pem")
    with pytest.raises(StreamConfigError, match="needs its key"):
        SyslogTarget("localhost", 6514, pki.ca, client_cert=pki.cert)
    with pytest.raises(StreamConfigError, match="port"):
        SyslogTarget("localhost", 0, pki.ca)
    assert CANARY not in repr(SyslogTarget("localhost", 6514, pki.ca))
