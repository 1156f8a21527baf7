"""The key broker forwards its own audit log when SEALED_AUDIT_FORWARD names a settings file
(docs/siem.md, "Inside the components"): started with the app, stopped with it."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from fastapi.testclient import TestClient

from policy.audit.stream.embedded import ENV
from policy.audit.stream.settings import TOKEN_ENV
from tests.key_broker.conftest import Clock, Harness
from tests.policy.audit.stream.helpers import check_received
from tests.policy.audit.stream.receivers import HecCollector, make_pki

TOKEN = "hec-broker-token"


def test_the_broker_forwards_its_audit_log_from_the_setting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pki = make_pki(tmp_path / "pki")
    collector = HecCollector(TOKEN, pki)
    config = tmp_path / "forward.json"
    config.write_text(json.dumps({"hec": {"url": collector.url, "ca": str(pki.ca)}, "poll_s": 0.05}))
    monkeypatch.setenv(ENV, str(config))
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    kb = Harness(tmp_path / "kb", Clock())
    try:
        with TestClient(kb.app) as client:  # the app's lifespan starts the forwarding
            kb.client = client
            assert kb.admin("POST", "/tenants/acme/key").status_code == 201
            written = len(kb.audit_entries())
            deadline = time.monotonic() + 120  # a hang guard, not a timed assertion
            while len(collector.events) < written:
                assert time.monotonic() < deadline, f"{len(collector.events)} of {written} events forwarded"
                threading.Event().wait(0.05)
    finally:
        kb.close()
        collector.stop()
    audit_dir = tmp_path / "kb" / "audit"
    key = serialization.load_pem_public_key((audit_dir / "keys" / "key-broker.pem").read_bytes())
    assert isinstance(key, Ed25519PublicKey)
    raws = [e["event"]["raw_data"] for e in collector.events if e["source"] == "sealed:key-broker"]
    entries = check_received(raws, written, key)
    assert any(e.tenant == "acme" for e in entries)
    assert (audit_dir / "forward" / "key-broker").is_dir()
