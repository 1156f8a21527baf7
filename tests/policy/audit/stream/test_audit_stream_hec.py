"""Audit forwarding to a real HEC-style HTTP collector in the test: order, collector restarts,
forwarder restarts (kill -9 of `sealed audit forward`), and the token's handling."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from policy.audit.stream.errors import DeliveryError, StreamConfigError
from policy.audit.stream.forwarder import Forwarder, ForwardSettings
from policy.audit.stream.hec import HecSender, HecTarget
from policy.audit.stream.settings import TOKEN_ENV, hec_token
from tests.policy.audit.stream.helpers import check_received, no_canary, write_entries
from tests.policy.audit.stream.receivers import HecCollector, Pki, make_pki

ROOT = Path(__file__).resolve().parents[4]
TOKEN = "hec-token-1b2c"


def _raw(events: list[dict[str, object]], component: str) -> list[str]:
    return [e["event"]["raw_data"] for e in events if e["source"] == f"sealed:{component}"]  # type: ignore[index]


def _settings(tmp_path: Path) -> ForwardSettings:
    return ForwardSettings(tmp_path / "audit", tmp_path / "state", batch=8, poll_s=0.02, backoff_min_s=0.02,
                           backoff_max_s=0.2)


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return make_pki(tmp_path / "pki")


def test_events_arrive_in_order_and_a_collector_restart_loses_nothing(tmp_path: Path, pki: Pki) -> None:
    collector = HecCollector(TOKEN, pki)
    write_entries(tmp_path / "audit", "gateway", 30)
    forwarder = Forwarder(_settings(tmp_path), HecSender(HecTarget(collector.url, TOKEN, pki.ca)))
    thread = forwarder.start()
    try:
        assert len(collector.wait_for(30)) == 30
        collector.stop()
        write_entries(tmp_path / "audit", "gateway", 30, start=30)
        write_entries(tmp_path / "audit", "key-broker", 12)
        while forwarder.failures == 0:  # it tries while the collector is down, and fails
            threading.Event().wait(0.01)
        collector.start()
        events = collector.wait_for(72)
    finally:
        forwarder.stop()
        thread.join()
        collector.stop()
    check_received(_raw(events, "gateway"), 60)
    check_received(_raw(events, "key-broker"), 12)
    first = events[0]
    assert first["sourcetype"] == "ocsf:api_activity"
    assert first["fields"] == {"event_id": first["event"]["metadata"]["uid"], "seq": 0}
    no_canary(events)


def test_a_wrong_token_is_a_delivery_failure_and_the_cursor_stays(tmp_path: Path, pki: Pki) -> None:
    collector = HecCollector(TOKEN, pki)
    write_entries(tmp_path / "audit", "gateway", 3)
    forwarder = Forwarder(_settings(tmp_path), HecSender(HecTarget(collector.url, "not-the-token", pki.ca)))
    with pytest.raises(DeliveryError, match="HTTP 401"):
        forwarder.pump()
    assert collector.events == []
    assert forwarder.cursor.position("gateway.audit.jsonl").seq == 0
    collector.stop()


def test_a_collector_with_an_untrusted_certificate_gets_nothing(tmp_path: Path, pki: Pki) -> None:
    collector = HecCollector(TOKEN, make_pki(tmp_path / "impostor", ca_name="someone else's CA"))
    write_entries(tmp_path / "audit", "gateway", 3)
    forwarder = Forwarder(_settings(tmp_path), HecSender(HecTarget(collector.url, TOKEN, pki.ca)))
    with pytest.raises(DeliveryError, match="ConnectError"):
        forwarder.pump()
    assert collector.events == []
    assert forwarder.cursor.position("gateway.audit.jsonl").seq == 0
    collector.stop()


def test_a_plaintext_collector_needs_the_unsafe_option() -> None:
    with pytest.raises(StreamConfigError, match="https://"):
        HecTarget("http://siem:8088/services/collector/event", TOKEN)
    assert HecTarget("http://siem:8088/x", TOKEN, unsafe_plaintext=True).unsafe_plaintext


def _forward(tmp_path: Path, url: str, ca: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), TOKEN_ENV: TOKEN}
    return subprocess.Popen([sys.executable, "-m", "api.cli.main", "audit", "forward", "--dir",
                             str(tmp_path / "audit"), "--state", str(tmp_path / "state"), "--hec-url", url,
                             "--hec-ca", str(ca), "--batch", "5", "--poll", "0.02"], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def test_kill_9_of_the_forwarder_and_of_the_collector_mid_run_loses_nothing(tmp_path: Path, pki: Pki) -> None:
    collector = HecCollector(TOKEN, pki)
    writer = threading.Thread(target=write_entries, args=(tmp_path / "audit", "gateway", 400))
    writer.start()
    proc = _forward(tmp_path, collector.url, pki.ca)
    try:
        collector.wait_for(40)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        collector.stop()  # both down at once; the log keeps growing
        proc = _forward(tmp_path, collector.url, pki.ca)
        collector.start()
        collector.wait_for(200)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        proc = _forward(tmp_path, collector.url, pki.ca)
        writer.join()
        deadline = time.monotonic() + 600  # a hang guard, not a timed assertion
        while len({e["fields"]["event_id"] for e in collector.wait_for(len(collector.events) + 1, 5)}) < 400:
            assert proc.poll() is None
            assert time.monotonic() < deadline
    finally:
        proc.kill()
        proc.wait()
        writer.join()
        collector.stop()
    check_received(_raw(collector.events, "gateway"), 400)


def test_the_token_never_comes_from_argv(tmp_path: Path) -> None:
    run = subprocess.run([sys.executable, "-m", "api.cli.main", "audit", "forward", "--dir", str(tmp_path),
                          "--hec-url", "http://127.0.0.1:9/x", "--hec-token", TOKEN], cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and "No such option" in run.stderr
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o644)
    with pytest.raises(StreamConfigError, match="readable by others"):
        hec_token(token_file, {})
    token_file.chmod(0o600)
    assert hec_token(token_file, {}) == TOKEN
    assert hec_token(None, {TOKEN_ENV: TOKEN}) == TOKEN
    with pytest.raises(StreamConfigError, match="no token"):
        hec_token(None, {})
    assert TOKEN not in repr(HecTarget("https://siem/x", TOKEN))
