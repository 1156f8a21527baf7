"""Finding 8: per-worker identity on heartbeats, and no SSRF or reflection through worker URLs.

Every worker used to hold the same register token and present a self-chosen worker id, so one
compromised worker could heartbeat as another (status=failed took a model down), and name an
internal URL as its `http_url`, which the unauthenticated /.well-known/attestation then fetched and
reflected. Now a heartbeat is signed by the worker's attested identity key, under the id derived
from that key, in order and fresh; and the gateway serves the attestation the worker submitted and
it verified, fetching nothing.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric import ec
from fastapi.testclient import TestClient

from api.gateway.settings import GatewaySettings, WorkerRoute
from api.gateway.worker_attestation import expected_binding
from attestation.bundle import EvidenceBundle, RuntimeData
from attestation.token import TokenIssuer
from enclave_worker.heartbeat import heartbeat_body
from enclave_worker.settings import WorkerSettings
from enclave_worker.state import LiveState, WorkerState
from protocol.broker.client import ReleasedKey
from protocol.heartbeat import heartbeat_signing_input
from tests.api.gateway_client import GatewayClient

REGISTER_TOKEN = "r" * 40
SCOPE = {"tenant": "acme", "model": "m", "version": "v1"}
ISSUER = TokenIssuer(ec.generate_private_key(ec.SECP256R1()), "sealed-key-broker")


class Worker:
    """A worker's identity and heartbeats exactly as `enclave_worker.heartbeat` makes them."""

    def __init__(self, tmp: Path, port: int, *, bind: bool = True) -> None:
        self.state = WorkerState(WorkerSettings(broker_url="", package_dir=tmp, **SCOPE),
                                 live=LiveState(status="ready"))
        public = self.state.identity().public_key.hex()
        hpke = self.state.serving_key.public_bytes
        evidence = EvidenceBundle(tee="sim", cpu_evidence=os.urandom(16),
                                  runtime_data=RuntimeData(os.urandom(32), hpke))
        binding = expected_binding("", public) if bind else os.urandom(32)
        token = ISSUER.issue({"sealed": SCOPE, "evidence_digest": evidence.digest(), "tee": "sim",
                              "runtime_data": {"channel_binding": binding.hex(), "hpke_public_key": hpke.hex()}},
                             dt.datetime.now(dt.UTC))
        released = ReleasedKey(os.urandom(32), token, "jti", evidence, {})
        self.state.live.booted = SimpleNamespace(released=released, model_digest="ab" * 32,  # type: ignore[assignment]
                                            engine=SimpleNamespace(stats=lambda: {}), gpu_cc_off=False,
                                            load_s=0.5)
        self.address = f"127.0.0.1:{port}"
        self.seq = 0

    def beat(self, **change: Any) -> dict[str, Any]:
        self.seq += 1
        body = heartbeat_body(self.state, self.address, "", self.seq)
        return {**body, **change}


def post(client: TestClient, body: dict[str, Any]) -> int:
    return client.post("/internal/workers/heartbeat", json=body,
                       headers={"Authorization": f"Bearer {REGISTER_TOKEN}"}).status_code


@pytest.fixture()
def gateway(tmp_path: Path) -> Iterator[GatewayClient]:
    jwks = tmp_path / "jwks.json"
    jwks.write_text(json.dumps(ISSUER.jwks()))
    settings = GatewaySettings(data_dir=tmp_path / "gw", dev=True, register_token=REGISTER_TOKEN,
                               jwt_secret="j" * 40, broker_jwks=jwks,
                               workers=(WorkerRoute(**SCOPE),))
    (tmp_path / "gw").mkdir()
    with GatewayClient(settings) as client:
        yield client


def public_workers(client: GatewayClient) -> list[dict[str, Any]]:
    """/.well-known/attestation as tenant acme sees it (it lists only the caller's tenant's workers)."""
    secret, _ = client.service.store.create_key("acme", "reader")
    answer = client.get("/.well-known/attestation", headers={"Authorization": f"Bearer {secret}"})
    assert answer.status_code == 200, answer.text
    return answer.json()["workers"]


def ready(client: GatewayClient) -> list[str]:
    registry = client.service.registry
    return [w.worker_id for w in registry.ready("acme", "m")]


def test_one_worker_cannot_heartbeat_as_another(gateway: GatewayClient, tmp_path: Path) -> None:
    victim, attacker = Worker(tmp_path, 5001), Worker(tmp_path, 5002)
    assert post(gateway, victim.beat()) == 200 and post(gateway, attacker.beat()) == 200
    assert set(ready(gateway)) == {victim.beat()["worker_id"], attacker.beat()["worker_id"]}
    victim_id = victim.beat()["worker_id"]
    public = public_workers(gateway)
    victim_doc = next(w for w in public if w["worker_id"] == victim_id)
    # Everything public about the victim, with the attacker's own (valid) key signing: refused.
    forged = attacker.beat(worker_id=victim_id, usage_public_key=victim_doc["usage_public_key"],
                           status="failed")
    forged["signature"] = attacker.state.usage_key.sign(heartbeat_signing_input(forged)).hex()
    assert post(gateway, forged) == 401
    # Its own key under the victim's id: refused (ids derive from keys).
    own_key = attacker.beat(worker_id=victim_id, status="failed")
    own_key["signature"] = attacker.state.usage_key.sign(heartbeat_signing_input(own_key)).hex()
    assert post(gateway, own_key) == 401
    # A captured heartbeat of the victim replayed, or edited: refused.
    captured = victim.beat()
    assert post(gateway, captured) == 200
    assert post(gateway, captured) == 409
    assert post(gateway, {**victim.beat(), "status": "failed"}) == 401
    assert victim_id in ready(gateway)  # the victim's model is still served


NEGATIVES = [
    ("field-changed-after-signing", lambda w: {**w.beat(), "grpc_address": "127.0.0.1:9"}, 401),
    ("stale", lambda w: _resigned(w, at=int(time.time()) - 3600), 401),
    ("id-not-derived-from-key", lambda w: _resigned(w, worker_id="w-chosen"), 401),
    ("no-signature", lambda w: {k: v for k, v in w.beat().items() if k != "signature"}, 400),
    ("garbage-signature", lambda w: {**w.beat(), "signature": "zz" * 64}, 401),
    ("url-as-grpc-address", lambda w: _resigned(w, grpc_address="http://169.254.169.254/latest"), 400),
    ("unknown-status", lambda w: _resigned(w, status="paused"), 400),  # not a ServingState
    # Names that form no ModelRef: refused at the route, never stored in the registry.
    ("model-not-a-model-ref", lambda w: _resigned(w, model="m..x"), 400),
    ("version-not-a-model-ref", lambda w: _resigned(w, version="v1/../v2"), 400),
]


def _resigned(worker: Worker, **change: Any) -> dict[str, Any]:
    body = worker.beat(**change)
    body["signature"] = worker.state.usage_key.sign(heartbeat_signing_input(body)).hex()
    return body


@pytest.mark.parametrize(("name", "make", "status"), NEGATIVES, ids=[n[0] for n in NEGATIVES])
def test_unsigned_or_stale_heartbeats_change_nothing(gateway: GatewayClient, tmp_path: Path, name: str, make: Any,
                                                     status: int) -> None:
    worker = Worker(tmp_path, 5001)
    assert post(gateway, make(worker)) == status
    assert ready(gateway) == []
    assert gateway.service.registry.workers == {}


class InternalService:
    """An address inside the operator's network that must never be fetched on a worker's word."""

    def __init__(self) -> None:
        self.hits: list[str] = []
        hits = self.hits

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                hits.append(self.path)
                body = json.dumps({"token": "INTERNAL-SECRET-METADATA", "evidence": {"x": 1}}).encode()
                self.send_response(200)
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_port}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_the_gateway_never_fetches_or_reflects_a_url_a_worker_supplies(gateway: GatewayClient, tmp_path: Path) -> None:
    internal = InternalService()
    try:
        worker = Worker(tmp_path, 5001)
        body = _resigned(worker, http_url=internal.url, attestation_url=internal.url)
        assert post(gateway, body) == 200
        text = json.dumps(public_workers(gateway))  # what an authenticated client is shown
        time.sleep(0.2)
        assert internal.hits == []
        assert "INTERNAL-SECRET-METADATA" not in text
    finally:
        internal.close()


def test_well_known_attestation_serves_only_what_the_worker_submitted_and_the_gateway_verified(
        gateway: GatewayClient, tmp_path: Path) -> None:
    good, unbound = Worker(tmp_path, 5001), Worker(tmp_path, 5002, bind=False)
    beat = good.beat()
    assert post(gateway, beat) == 200 and post(gateway, unbound.beat()) == 200
    workers = {w["worker_id"]: w for w in public_workers(gateway)}
    served = workers[beat["worker_id"]]
    assert {k: served[k] for k in beat["attestation"]} == beat["attestation"]
    other = workers[unbound.beat()["worker_id"]]
    assert other["status"] == "unavailable" and "token" not in other and "evidence" not in other
    assert ready(gateway) == [beat["worker_id"]]  # the unbound worker is never routed to
