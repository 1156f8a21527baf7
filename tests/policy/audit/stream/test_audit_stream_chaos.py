"""Issue #37's acceptance run: a real gateway audits 1,000 management requests while
`sealed audit forward` streams its log to a real rsyslog over TLS and to an HEC-style collector
process; the forwarder, the collector, rsyslog and the gateway are each killed with SIGKILL at
seeded-random points and started again. Afterwards, from what each SIEM stored alone: every entry of
every log arrived at least once, first arrivals are in log order, a duplicate carries the same
event id, every request the gateway acknowledged is there, and the hash chain and the signatures
verify with the component's published key.

The seed is printed (pytest shows it with the output of a failure); SEALED_AUDIT_CHAOS_SEED=N
replays a plan. The plan is keyed to request counts, so it is the same on a slow machine.
"""

from __future__ import annotations

import json
import os
import secrets
import sys
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from api.management.auth import issue_token
from policy.audit import read_entries
from policy.audit.entry import AuditEntry, parse_entry
from policy.audit.stream.settings import TOKEN_ENV
from tests.policy.audit.stream.chaos import Driver, Proc, listening, make_plan, wait_until
from tests.policy.audit.stream.hec_collector import read_index
from tests.policy.audit.stream.helpers import check_received
from tests.policy.audit.stream.receivers import free_port, make_pki
from tests.policy.audit.stream.rsyslog import Rsyslog, raw_entry, require_rsyslog

ROOT = Path(__file__).resolve().parents[4]
REQUESTS = 1000
KILLS = {"gateway": 3, "forwarder": 3, "collector": 3, "rsyslog": 3}
TOKEN = "hec-chaos-" + secrets.token_hex(8)


def _gateway(tmp: Path, env: dict[str, str], jwt_secret: str) -> tuple[Proc, str]:
    data = tmp / "gw"
    data.mkdir()
    (data / "jwt-secret").write_text(jwt_secret)
    (data / "register-token").write_text(secrets.token_urlsafe(32))
    port = free_port()
    url = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        try:
            return httpx.get(f"{url}/healthz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    argv = [sys.executable, "-m", "api.gateway", "--data-dir", str(data), "--port", str(port),
            "--jwt-secret-file", str(data / "jwt-secret"), "--register-token-file", str(data / "register-token")]
    return Proc("gateway", argv, env, tmp / "gateway.log", healthy), url


def _hec_stored(index: Path) -> dict[str, list[str]]:
    """What the collector stored, per log (component), as the signed entries, in arrival order."""
    out: dict[str, list[str]] = {}
    for event in read_index(index):
        raw = event["event"]["raw_data"]
        entry, _ = parse_entry(raw)
        # The event id is the entry's chain hash in both places a SIEM would deduplicate on.
        assert event["fields"]["event_id"] == event["event"]["metadata"]["uid"] == entry.hash
        assert event["source"] == f"sealed:{entry.component}"
        out.setdefault(entry.component, []).append(raw)
    return out


def _syslog_stored(server: Rsyslog) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in server.lines():
        raw = raw_entry(line)
        if raw is None:  # a message rsyslog did not finish writing when it was killed (sent again)
            continue
        entry, _ = parse_entry(raw)
        assert f'uid="{entry.hash}"' in line and f" sealed-{entry.component} " in line
        out.setdefault(entry.component, []).append(raw)
    return out


def _cursors_at_end(state: Path, logs: dict[str, list[AuditEntry]]) -> bool:
    cursors = sorted(state.glob("*.cursor.json"))
    if len(cursors) != 2:  # one per destination
        return False
    try:
        positions = [json.loads(c.read_text())["logs"] for c in cursors]
    except ValueError:
        return False
    return all(p.get(f"{name}.audit.jsonl", {}).get("seq") == len(entries)
               for p in positions for name, entries in logs.items())


def _published_key(audit_dir: Path, component: str) -> Ed25519PublicKey:
    key = serialization.load_pem_public_key((audit_dir / "keys" / f"{component}.pem").read_bytes())
    assert isinstance(key, Ed25519PublicKey)
    return key


def _check_siem(name: str, stored: dict[str, list[str]], logs: dict[str, list[AuditEntry]],
                audit_dir: Path, acked: list[str]) -> dict[str, Any]:
    assert set(stored) == set(logs), f"{name}: logs received {sorted(stored)}, written {sorted(logs)}"
    summary: dict[str, Any] = {}
    for component, written in logs.items():
        got = check_received(stored[component], len(written), _published_key(audit_dir, component))
        assert [e.hash for e in got] == [e.hash for e in written]  # the very entries the log holds
        counts = Counter(parse_entry(raw)[0].hash for raw in stored[component])
        summary[component] = {"entries": len(written), "received": len(stored[component]),
                              "duplicated": sum(1 for n in counts.values() if n > 1)}
    upserts = {e.tenant for e in logs.get("gateway", []) if e.action == "tenant-upsert"}
    missing = [t for t in acked if t not in upserts]
    assert not missing, f"{name}: acknowledged requests without an audit event: {missing[:5]}"
    return summary


def test_kill_9_of_forwarder_collector_rsyslog_and_gateway_during_1000_audited_requests(
        tmp_path: Path, record_property: Any) -> None:
    require_rsyslog()
    seed = int(os.environ.get("SEALED_AUDIT_CHAOS_SEED") or secrets.randbits(32))
    plan = make_plan(seed, REQUESTS, KILLS, max_down=80)
    print(f"audit chaos seed={seed} (SEALED_AUDIT_CHAOS_SEED={seed} replays the plan)", flush=True)
    record_property("seed", seed)
    pki = make_pki(tmp_path / "pki")
    audit_dir, index = tmp_path / "audit", tmp_path / "hec-index.jsonl"
    env = {**os.environ, "PYTHONPATH": str(ROOT), TOKEN_ENV: TOKEN, "HEC_TOKEN": TOKEN}
    jwt_secret = secrets.token_urlsafe(48)
    gateway, url = _gateway(tmp_path, env, jwt_secret)
    hec_port = free_port()
    collector = Proc("collector", [sys.executable, "-m", "tests.policy.audit.stream.hec_collector", "--port",
                                   str(hec_port), "--pki", str(pki.ca.parent), "--out", str(index)],
                     env, tmp_path / "collector.log", listening(hec_port))
    rsyslog_dir = tmp_path / "rsyslog"
    rsyslog_dir.mkdir()
    rsyslog = Rsyslog(rsyslog_dir, pki)
    forwarder = Proc("forwarder", [sys.executable, "-m", "api.cli.main", "audit", "forward", "--dir", str(audit_dir),
                                   "--state", str(tmp_path / "cursors"), "--syslog", f"localhost:{rsyslog.port}",
                                   "--syslog-ca", str(pki.ca), "--hec-url",
                                   f"https://localhost:{hec_port}/services/collector/event", "--hec-ca", str(pki.ca),
                                   "--hostname", "gw-1", "--batch", "20", "--poll", "0.05"],
                     env, tmp_path / "forwarder.log")
    targets: dict[str, Any] = {"gateway": gateway, "collector": collector, "rsyslog": rsyslog,
                               "forwarder": forwarder}
    driver = Driver(url, issue_token(jwt_secret, "chaos@ops", "operator"), REQUESTS)
    thread = threading.Thread(target=driver.run, daemon=True)
    try:
        for target in targets.values():
            target.start()
        driver.gateway_up.set()
        thread.start()
        for step in plan:
            driver.wait_for(step.at)
            if step.target == "gateway":
                driver.gateway_up.clear()  # the driver waits for the restart instead of spinning
            getattr(targets[step.target], step.action)()
            if step.target == "gateway" and step.action == "start":
                driver.gateway_up.set()
        driver.wait_for(REQUESTS)
        thread.join()
        gateway.stop()  # the log is complete; now everything in it must reach both SIEMs
        logs = {p.name.removesuffix(".audit.jsonl"): read_entries(p) for p in sorted(audit_dir.glob("*.audit.jsonl"))}

        # The forwarder's own claim: both cursors at the end of every log (each destination
        # acknowledged everything). Then what the SIEMs stored is checked against the logs.
        wait_until(lambda: _cursors_at_end(tmp_path / "cursors", logs), "the forwarder's cursors at the end")
    finally:
        driver.gateway_up.set()
        for target in targets.values():
            target.stop()
    hec = _check_siem("hec", _hec_stored(index), logs, audit_dir, driver.acked)
    syslog = _check_siem("rsyslog", _syslog_stored(rsyslog), logs, audit_dir, driver.acked)
    print(f"seed={seed} kills={ {t: n for t, n in KILLS.items()} } request retries={driver.retries} "
          f"hec={hec} rsyslog={syslog}")
    assert len(driver.acked) == REQUESTS
