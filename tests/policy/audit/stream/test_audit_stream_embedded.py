"""Forwarding started by the components themselves (SEALED_AUDIT_FORWARD=FILE): the settings file
is checked before anything starts, and a real gateway process forwards its own log with no
`sealed audit forward` beside it. (The key broker's side: tests/key_broker/test_broker_audit_forward.py.)"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from api.management.auth import issue_token
from policy.audit.stream.embedded import ENV, ForwardConfig, forwarding_from_env
from policy.audit.stream.errors import StreamConfigError
from policy.audit.stream.settings import TOKEN_ENV
from tests.policy.audit.stream.chaos import wait_until
from tests.policy.audit.stream.helpers import check_received
from tests.policy.audit.stream.receivers import HecCollector, Pki, free_port, make_pki

ROOT = Path(__file__).resolve().parents[4]
TOKEN = "hec-embedded-token"


def _config(tmp_path: Path, doc: dict[str, Any]) -> Path:
    path = tmp_path / "forward.json"
    path.write_text(json.dumps(doc))
    return path


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return make_pki(tmp_path / "pki")


def test_no_setting_no_forwarding_and_a_bad_file_stops_the_start(tmp_path: Path, pki: Pki) -> None:
    assert forwarding_from_env({"gateway": tmp_path}, {}) is None
    env = {TOKEN_ENV: TOKEN}
    hec = {"url": "https://localhost:8088/services/collector/event", "ca": str(pki.ca)}
    refused = [
        ({"hec": hec, "hostnme": "gw-1"}, "unknown key"),  # a typo is not ignored
        ({"hec": {**hec, "token": TOKEN}}, "unknown key"),  # the token never sits in the file
        ({"hec": {**hec, "url": "http://siem:8088/x"}}, "https://"),
        ({"syslog": {"address": "siem:6514"}}, "TLS is required"),
        ({"syslog": {"address": "siem", "ca": str(pki.ca)}}, "HOST:PORT"),
        ({}, "syslog and/or an hec"),
        ({"hec": hec, "batch": "many"}, "numbers"),
    ]
    for doc, message in refused:
        with pytest.raises(StreamConfigError, match=message):
            forwarding_from_env({"gateway": tmp_path}, {ENV: str(_config(tmp_path, doc)), **env})
    with pytest.raises(StreamConfigError, match="no token"):
        ForwardConfig.from_file(_config(tmp_path, {"hec": hec}), {})
    (tmp_path / "forward.json").write_text("{not json")
    with pytest.raises(StreamConfigError, match="not JSON"):
        ForwardConfig.from_file(tmp_path / "forward.json", env)
    plain = ForwardConfig.from_file(_config(tmp_path, {"hec": {**hec, "url": "http://siem:8088/x",
                                                               "unsafe_plaintext": True}}), env)
    assert plain.hec is not None and plain.hec.unsafe_plaintext and TOKEN not in repr(plain)


def test_a_gateway_forwards_its_own_audit_log_when_the_setting_names_a_collector(tmp_path: Path, pki: Pki) -> None:
    collector = HecCollector(TOKEN, pki)
    config = _config(tmp_path, {"hec": {"url": collector.url, "ca": str(pki.ca)}, "hostname": "gw-1",
                                "poll_s": 0.05})
    data, port, jwt_secret = tmp_path / "gw", free_port(), secrets.token_urlsafe(48)
    data.mkdir()
    (data / "jwt-secret").write_text(jwt_secret)
    (data / "register-token").write_text(secrets.token_urlsafe(32))
    env = {**os.environ, "PYTHONPATH": str(ROOT), ENV: str(config), TOKEN_ENV: TOKEN}
    proc = subprocess.Popen([sys.executable, "-m", "api.gateway", "--data-dir", str(data), "--port", str(port),
                             "--jwt-secret-file", str(data / "jwt-secret"),
                             "--register-token-file", str(data / "register-token")], env=env,
                            stdout=open(tmp_path / "gateway.log", "wb"), stderr=subprocess.STDOUT)  # noqa: SIM115
    url, headers = f"http://127.0.0.1:{port}", {"Authorization": f"Bearer {issue_token(jwt_secret, 'op', 'operator')}"}

    def healthy() -> bool:
        try:
            return httpx.get(f"{url}/healthz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_until(healthy, "gateway", lambda: proc.poll() is None)
        for name in ("acme", "globex", "initech"):
            assert httpx.post(f"{url}/admin/v1/tenants", json={"name": name}, headers=headers).status_code == 201
        wait_until(lambda: len(collector.events) >= 3, "three events at the collector", lambda: proc.poll() is None)
    finally:
        proc.terminate()
        proc.wait(60)
        collector.stop()
    events = [e for e in collector.events if e["source"] == "sealed:gateway"]
    key = serialization.load_pem_public_key((tmp_path / "audit" / "keys" / "gateway.pem").read_bytes())
    assert isinstance(key, Ed25519PublicKey)
    entries = check_received([e["event"]["raw_data"] for e in events], 3, key)
    assert [(e.action, e.tenant) for e in entries] == [("tenant-upsert", t) for t in ("acme", "globex", "initech")]
    assert {e["host"] for e in events} == {"gw-1"}
    assert (tmp_path / "audit" / "forward" / "gateway").is_dir()  # its cursors, apart from other components'
