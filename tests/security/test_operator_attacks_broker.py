"""The operator impersonates the key broker between a worker and the broker, live (issue #32, finding 3).

The stack of tests/security/test_operator_attacks.py (fake-TEE harness: the worker attests as SEV-SNP
through the fake kernel interface, the test PKI plays AMD; the broker runs on the simulated TEE as
`sealed up` runs it). The operator holds the network between worker and broker: each attack is a proxy
the worker's `--broker-url` points at. The worker pins the broker's measurement in its measured
configuration and authenticates the broker's evidence, then the token and the receipt under the keys
that evidence binds (enclave_worker/broker_auth.py). Each attack is refused: the worker never reaches
"ready", serves nothing, and says why in its log and its status. And the operator reading every file
of the broker's data directory finds none of the broker's private keys in plaintext.
"""

from __future__ import annotations

import base64
import hashlib
import http.server
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from api.broker_state import local_broker_keys
from api.ports import free_port
from api.stack import worker_args
from protocol.broker.receipts import receipt_payload
from protocol.broker.sealing import release_info, seal
from protocol.model_ref import ModelRef
from tests.security import test_operator_attacks as operator_attacks
from tests.security.test_operator_attacks import Live

live = operator_attacks.live  # the module-scoped live stack (fake SEV-SNP worker, real broker and gateway)

ROOT = Path(__file__).resolve().parents[2]
Rewrite = Callable[[str, dict[str, Any], dict[str, Any]], dict[str, Any]]


class BrokerProxy(http.server.ThreadingHTTPServer):
    """The operator between worker and broker: forwards every call, and may rewrite an answer."""

    def __init__(self, upstream: str, rewrite: Rewrite | None = None) -> None:
        super().__init__(("127.0.0.1", 0), _Relay)
        self.upstream = upstream
        self.rewrite = rewrite
        self.paths: list[str] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Relay(http.server.BaseHTTPRequestHandler):
    server: BrokerProxy

    def log_message(self, *_: Any) -> None:
        pass

    def _relay(self) -> None:
        body = self.rfile.read(int(self.headers.get("content-length") or 0))
        self.server.paths.append(self.path)
        answer = httpx.request(self.command, self.server.upstream + self.path, content=body, timeout=60,
                               headers={"content-type": self.headers.get("content-type", "application/json")})
        content = answer.content
        if self.server.rewrite is not None and answer.status_code == 200:
            request = json.loads(body) if body else {}
            content = json.dumps(self.server.rewrite(self.path, request, answer.json())).encode()
        self.send_response(answer.status_code)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(content)))
        self.end_headers()
        self.wfile.write(content)

    do_GET = do_POST = _relay


@pytest.fixture()
def proxies() -> Iterator[list[BrokerProxy]]:
    made: list[BrokerProxy] = []
    yield made
    for proxy in made:
        proxy.shutdown()


def proxy_for(live: Live, made: list[BrokerProxy], rewrite: Rewrite | None, upstream: str | None = None) -> BrokerProxy:
    proxy = BrokerProxy(upstream or live.stack.broker_url, rewrite)
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    made.append(proxy)
    return proxy


class Worker:
    """One more worker of the demo model (fake SEV-SNP), talking to the 'broker' at `broker_url`."""

    def __init__(self, live: Live, broker_url: str, name: str) -> None:
        home, platform = live.env.home, live.env.platform.root
        self.port = free_port()
        self.log = home.logs / f"{name}.log"
        args = worker_args(home, broker_url, self.port, free_port(), [live.stack.gateway_url])
        argv = [sys.executable, "-m", "tests.enclave_worker.fake_tee_worker", "--platform", str(platform),
                "--cpu", "snp", "--nvml", "none", *args[1:], "--tee", "snp"]
        self.proc = subprocess.Popen(argv, cwd=ROOT, stdout=open(self.log, "wb"), stderr=subprocess.STDOUT,  # noqa: SIM115
                                     env={**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"})

    def status(self, timeout: float = 240.0) -> dict[str, Any]:
        """Its status once boot ended (ready or failed)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.log.read_text()[-3000:]
            try:
                doc = dict(httpx.get(f"http://127.0.0.1:{self.port}/internal/status", timeout=2).json())
                if doc.get("status") in ("ready", "failed"):
                    return doc
            except (httpx.HTTPError, ValueError):
                pass
            time.sleep(0.25)
        raise TimeoutError(self.log.read_text()[-3000:])

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def refused(live: Live, broker_url: str, name: str, expect_log: str) -> None:
    worker = Worker(live, broker_url, name)
    try:
        status = worker.status()
        assert status["status"] == "failed", status
        assert status.get("reason") == "key broker not authenticated", status
    finally:
        worker.stop()
    text = worker.log.read_text()
    assert expect_log in text, text[-3000:]  # the refusal is logged, with its cause
    assert "loaded on" not in text and "serving" not in text


def _operator_receipt_key() -> Ed25519PrivateKey:
    return Ed25519PrivateKey.generate()


# --- the attacks ---------------------------------------------------------------------------------


def test_the_genuine_broker_through_a_passive_proxy_is_accepted(live: Live, proxies: list[BrokerProxy]) -> None:
    """The control case: the same proxy, forwarding untouched; the worker authenticates and serves."""
    proxy = proxy_for(live, proxies, None)
    worker = Worker(live, proxy.url, "worker-broker-control")
    try:
        assert worker.status()["status"] == "ready", worker.log.read_text()[-3000:]
    finally:
        worker.stop()
    assert "/v1/broker/attestation" in proxy.paths
    assert "key broker authenticated" in worker.log.read_text()


def test_an_identity_with_the_operators_keys_is_refused(live: Live, proxies: list[BrokerProxy]) -> None:
    """The proxy relays the real broker's evidence but names its own receipt key in the identity."""
    mine = _operator_receipt_key().public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)

    def rewrite(path: str, _: dict, answer: dict) -> dict:
        if path == "/v1/broker/attestation":
            answer["identity"]["receipt_key"] = mine.hex()
        return answer

    proxy = proxy_for(live, proxies, rewrite)
    refused(live, proxy.url, "worker-broker-identity", "key broker NOT authenticated (FreshnessError)")
    assert "/v1/key" not in proxy.paths  # no key was even asked for


def test_a_broker_of_another_measurement_is_refused(live: Live, proxies: list[BrokerProxy], tmp_path: Path) -> None:
    """The operator's own broker answers: the same code, but another measured configuration (it does
    not accept simulated workers), so another measurement than the one the worker pins."""
    home = live.env.home
    port = free_port()
    log = tmp_path / "operator-broker.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "key_broker", "--data-dir", str(tmp_path / "broker"), "--port", str(port),
         "--sim-platform-signing-key", str(home.sim_key), "--init"],
        cwd=ROOT, stdout=open(log, "wb"), stderr=subprocess.STDOUT,  # noqa: SIM115
        env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-2000:]
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        refused(live, f"http://127.0.0.1:{port}", "worker-broker-measurement",
                "key broker NOT authenticated (BrokerIdentityError)")
    finally:
        proc.terminate()
        proc.wait(15)


def test_a_forged_receipt_is_refused(live: Live, proxies: list[BrokerProxy]) -> None:
    """The real release, but the receipt names the operator's signer (finding 3's package swap)."""
    operator_signer = "ed25519:" + "ab" * 32

    def rewrite(path: str, _: dict, answer: dict) -> dict:
        if path == "/v1/key":
            answer["receipt"]["receipt"]["signer"] = operator_signer
        return answer

    proxy = proxy_for(live, proxies, rewrite)
    refused(live, proxy.url, "worker-broker-receipt", "key release NOT authenticated (ReceiptInvalid)")


def test_a_data_key_of_the_operators_choosing_is_refused(live: Live, proxies: list[BrokerProxy]) -> None:
    """The proxy answers /v1/key with a data key it chose, sealed to the worker's (public) HPKE key,
    and a receipt it signed itself covering that sealed key: the receipt key is not the attested one."""
    signer = _operator_receipt_key()
    ref = ModelRef("demo", "smollm2-135m-instruct", "v1")

    def rewrite(path: str, request: dict, answer: dict) -> dict:
        if path != "/v1/key":
            return answer
        import jwt

        claims = jwt.decode(request["token"], options={"verify_signature": False})
        sealed = seal(os.urandom(32), bytes.fromhex(claims["runtime_data"]["hpke_public_key"]),
                      release_info(ref, answer["token_id"]))
        body = {**answer["receipt"]["receipt"], "sealed_key_sha256": hashlib.sha256(sealed).hexdigest()}
        answer["sealed_key"] = base64.b64encode(sealed).decode()
        signature = base64.b64encode(signer.sign(receipt_payload(body))).decode()
        answer["receipt"] = {"receipt": body, "signature": signature}
        return answer

    proxy = proxy_for(live, proxies, rewrite)
    refused(live, proxy.url, "worker-broker-datakey", "key release NOT authenticated (ReceiptInvalid)")


def test_a_replayed_receipt_for_another_sealed_key_is_refused(live: Live, proxies: list[BrokerProxy]) -> None:
    """The operator keeps the broker's genuine receipt but swaps the sealed key it covers."""
    def rewrite(path: str, request: dict, answer: dict) -> dict:
        if path == "/v1/key":
            import jwt

            claims = jwt.decode(request["token"], options={"verify_signature": False})
            sealed = seal(os.urandom(32), bytes.fromhex(claims["runtime_data"]["hpke_public_key"]),
                          release_info(ModelRef("demo", "smollm2-135m-instruct", "v1"), answer["token_id"]))
            answer["sealed_key"] = base64.b64encode(sealed).decode()
        return answer

    proxy = proxy_for(live, proxies, rewrite)
    refused(live, proxy.url, "worker-broker-sealedkey", "key release NOT authenticated (ReceiptInvalid)")


def test_forged_lease_answers_are_not_taken(live: Live, proxies: list[BrokerProxy]) -> None:
    """Once the worker holds the attested broker's key, a lease answer the operator forges (an
    "active" with a MAC of its own) is refused: the lease is not extended by it."""
    forged: list[int] = []

    def rewrite(path: str, _: dict, answer: dict) -> dict:
        if path == "/v1/lease":
            forged.append(answer["seq"])
            answer["status"], answer["lease_s"], answer["mac"] = "active", 3600, "00" * 32
        return answer

    proxy = proxy_for(live, proxies, rewrite)
    worker = Worker(live, proxy.url, "worker-broker-lease")
    try:
        assert worker.status()["status"] == "ready", worker.log.read_text()[-3000:]
        deadline = time.monotonic() + 120
        while "LeaseAnswerInvalid" not in worker.log.read_text():
            assert time.monotonic() < deadline, worker.log.read_text()[-3000:]
            time.sleep(0.25)
    finally:
        worker.stop()
    assert forged
    assert "key lease renewal failed (LeaseAnswerInvalid)" in worker.log.read_text()


def test_no_private_key_of_the_broker_is_in_its_data_directory(live: Live) -> None:
    """The operator reads every file of the broker's data directory: no PEM private key, and none of
    the broker's private keys as raw bytes, hex or base64 (they exist only sealed)."""
    # Only the simulated platform key (the operator's, in this harness) can open them, to know what to look for.
    keys = local_broker_keys(live.env.home)
    raw = [keys.master_key,
           keys.token_key.private_numbers().private_value.to_bytes(32, "big"),
           keys.receipt_key.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
                                          serialization.NoEncryption()),
           keys.import_key.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
                                         serialization.NoEncryption())]
    needles = [form for r in raw for form in (r, r.hex().encode(), base64.b64encode(r))]
    files = [p for p in live.env.home.broker.rglob("*") if p.is_file()]
    assert any(p.name == "broker-keys.sealed" for p in files)
    for path in files:
        data = path.read_bytes()
        assert b"PRIVATE KEY" not in data, path
        for needle in needles:
            assert needle not in data, f"a broker private key in plaintext in {path}"


@pytest.mark.parametrize("case", ["operator-signed", "missing"])
def test_a_broker_with_the_operators_own_state_is_refused(live: Live, proxies: list[BrokerProxy], case: str) -> None:
    """A second copy of the genuine broker, run by the operator with state of its own, passes the
    evidence, token and receipt checks (same code, same measurement, its own keys). What it cannot
    hand over is a release policy the tenant signed: here the genuine answer's policy is re-signed
    with the operator's key, or dropped (a policy naming another signer than the receipt's, or
    another version: tests/enclave_worker/test_release_policy_check.py)."""
    from policy.release_documents import sign_release_policy

    operator_key = Ed25519PrivateKey.generate()

    def rewrite(path: str, _: dict, answer: dict) -> dict:
        if path != "/v1/key":
            return answer
        if case == "missing":
            answer.pop("release_policy", None)
        else:  # its own policy (here: the tenant's text, naming the tenant's key id) signed by its own key
            envelope = answer["release_policy"]
            answer["release_policy"] = sign_release_policy(envelope["payload"], operator_key, envelope["key_id"])
        return answer

    proxy = proxy_for(live, proxies, rewrite)
    expected = ("no tenant-signed release policy" if case == "missing"
                else "not signed by this worker's tenant")
    refused(live, proxy.url, f"worker-broker-state-{case}", "key release NOT authenticated (BrokerNotAuthenticated)")
    assert expected in (live.env.home.logs / f"worker-broker-state-{case}.log").read_text()
