"""A gateway the operator runs (a real HTTP server on 127.0.0.1) in front of stand-in workers that
speak the real sealed protocol, for the attacks on a client that pins its tenant (issue #46).

Workers attest on the simulated TEE with a platform key the test holds (as `sealed up`'s operator
holds it: used here only for evidence that honestly reports each worker's own measurement). Each
worker's release statement is made by the worker's own code path (enclave_worker/release_statement.py)
over the release-policy envelope it got with its key. The gateway records every sealed request it
could open with a worker key it holds (the operator's own image holds its key), so a test can tell
whether a canary left the client.
"""

from __future__ import annotations

import datetime as dt
import http.server
import json
import os
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from attestation.bundle import EvidenceBundle, RuntimeData, channel_binding, expected_report_data
from attestation.refvalues import sign_reference_values
from attestation.sim import SimTee
from attestation.token import TokenIssuer
from attestation.workload import WorkloadClaims
from enclave_worker.release_statement import release_statement
from policy.release import ReleasePolicy
from policy.release_documents import public_pem, sign_release_policy
from protocol.sealed import Receipt, ReplayGuard, RequestContext, WorkerKey, api_key_id, open_request, sign_receipt
from protocol.sealed.http import HEADER_KEY_ID, HEADER_MODEL, ResponseHead

TENANT, MODEL, VERSION, DIGEST = "acme", "m", "v1", "d" * 64
GENUINE = "ab" * 48  # the measurement of the image the tenant's release policy names
PROMISES = {"prompts_logged": False}
CANARY = "canary-46-9d1e7a03"
ANSWER = {"id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": MODEL, "tee": "sim",
          "choices": [{"index": 0, "message": {"role": "assistant", "content": "an answer"},
                       "finish_reason": "stop", "logprobs": None}],
          "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}}


def raw(key: Ed25519PrivateKey) -> bytes:
    return key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


@dataclass
class TenantKeys:
    """What only the tenant holds: its policy-admin key."""

    admin: Ed25519PrivateKey = field(default_factory=Ed25519PrivateKey.generate)
    key_id: str = "acme-admin"

    def release_policy(self, version: int = 1, measurements: tuple[str, ...] = (GENUINE,)) -> dict[str, Any]:
        return sign_release_policy(ReleasePolicy(
            policy_id="acme-m", version=version, tenant=TENANT, model=MODEL, allowed_tee=frozenset({"sim"}),
            allowed_measurements=frozenset(measurements), unsafe_allow_simulated_tee=True), self.admin, self.key_id)

    def pin(self) -> list[dict[str, str]]:
        return [{"key_id": self.key_id, "public_key_pem": public_pem(self.admin.public_key())}]


class StandInWorker:
    """One worker: its own HPKE and receipt keys, evidence of `measurement`, a token, and the statement
    of the release policy its key came under (`envelope`; None: it states none)."""

    def __init__(self, platform: Ed25519PrivateKey, measurement: str = GENUINE, policy_version: int = 1,
                 envelope: Mapping[str, Any] | None = None, data_key_id: str = "k-acme-m-v1") -> None:
        self.key, self.usage = WorkerKey.generate(), Ed25519PrivateKey.generate()
        self.platform, self.measurement = platform, measurement
        self.workload = WorkloadClaims(TENANT, MODEL, VERSION, DIGEST, PROMISES, policy_version=policy_version)
        self.envelope, self.data_key_id = envelope, data_key_id
        self.replay = ReplayGuard()
        self.opened: list[bytes] = []  # every request body this worker decrypted
        self.token = ""
        self.bundle: EvidenceBundle | None = None

    def make_bundle(self, runtime: RuntimeData) -> EvidenceBundle:
        """Evidence over `runtime` (the broker's nonce) binding this worker's keys and workload."""
        runtime = RuntimeData(nonce=runtime.nonce, hpke_public_key=self.key.public_bytes,
                              channel_binding=channel_binding(b"", raw(self.usage)), workload=self.workload.encode())
        report = SimTee(self.platform, bytes.fromhex(self.measurement)).get_report(expected_report_data(runtime, ()))
        self.bundle = EvidenceBundle(tee="sim", cpu_evidence=report, runtime_data=runtime)
        return self.bundle

    def attest_with(self, issuer: TokenIssuer) -> None:
        """A token from `issuer` (the genuine broker's key, in tests that need no broker process)."""
        bundle = self.make_bundle(RuntimeData(nonce=os.urandom(32), hpke_public_key=self.key.public_bytes))
        claims = {"tee": "sim", "measurement": self.measurement, "insecure": True, "debug": False, "tcb": {},
                  "gpus": [], "evidence_digest": bundle.digest(),
                  "runtime_data": {"hpke_public_key": self.key.public_bytes.hex()},
                  "sealed": {"tenant": TENANT, "model": MODEL, "version": VERSION}}
        self.token = issuer.issue(claims, dt.datetime.now(dt.UTC))

    def statement(self) -> dict[str, Any] | None:
        """The worker's own code path: a statement only for a policy it holds (checked at release)."""
        if self.envelope is None:
            return None
        payload = {k: v for k, v in self.envelope["payload"].items() if k != "reference_values"}
        state = SimpleNamespace(
            settings=SimpleNamespace(tenant=TENANT, model=MODEL, version=VERSION), serving_key=self.key,
            usage_key=self.usage, booted=SimpleNamespace(
                release_policy=ReleasePolicy.from_dict(payload), released=SimpleNamespace(release_policy=self.envelope),
                decrypted=SimpleNamespace(manifest=SimpleNamespace(key_id=self.data_key_id))))
        return release_statement(state)

    def document(self) -> dict[str, Any]:
        assert self.bundle is not None and self.token
        return {"worker_id": self.key.key_id[:16], "model": MODEL, "version": VERSION, "tenant": TENANT,
                "usage_public_key": raw(self.usage).hex(), "grpc_tls_cert": None, "token": self.token,
                "evidence": self.bundle.to_json(), "sealed_key_id": self.key.key_id, "promises": dict(PROMISES),
                "model_digest": DIGEST, "tee": "sim", "insecure": True, "release": self.statement()}

    def answer(self, ctx: RequestContext, wire: bytes) -> bytes:
        opened = open_request(self.key, ctx, wire, time.time(), self.replay)
        self.opened.append(opened.body)
        sealer = opened.sealer
        out = sealer.header() + sealer.seal(ResponseHead(200, "application/json").encode())
        out += sealer.seal(json.dumps(ANSWER).encode())
        receipt = Receipt(request_sha256=opened.request_sha256, response_sha256=sealer.hash.hexdigest(),
                          worker_key_id=self.key.key_id, tenant=TENANT, model=MODEL, model_version=VERSION,
                          model_digest=DIGEST, policy_version=ctx.policy_version, prompt_tokens=3,
                          completion_tokens=2, tee="sim", insecure=True, issued_at=time.time(),
                          api_key_id=ctx.api_key_id, signing_key=raw(self.usage).hex(), channel_spki="",
                          evidence_sha256=self.bundle.digest() if self.bundle else "")
        return out + sealer.seal(sign_receipt(receipt, self.usage), final=True)


class OperatorGateway(http.server.ThreadingHTTPServer):
    """Serves `/.well-known/attestation` (the workers in `shown`), the reference values it is given,
    and routes sealed requests to the worker whose key they name (409 reattest_required if none)."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.shown: list[StandInWorker] = []
        self.reference_values: dict[str, Any] | None = None
        self.sealed_posts = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def canary_opened(self) -> bool:
        return any(CANARY.encode() in body for w in self.shown for body in w.opened)


class _Handler(http.server.BaseHTTPRequestHandler):
    server: OperatorGateway

    def log_message(self, *_: Any) -> None:
        pass

    def _send(self, status: int, body: bytes, content_type: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("content-type", content_type)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        if self.path == "/.well-known/attestation":
            self._send(200, json.dumps({"workers": [w.document() for w in self.server.shown]}).encode())
        elif self.path == "/.well-known/reference-values" and self.server.reference_values is not None:
            self._send(200, json.dumps(self.server.reference_values).encode())
        elif self.path == "/v1/models":
            self._send(200, b'{"object": "list", "data": []}')
        else:
            self._send(404, b'{"error": {"message": "not found", "type": "invalid_request_error", '
                            b'"param": null, "code": "not_found"}}')

    def do_POST(self) -> None:
        wire = self.rfile.read(int(self.headers.get("content-length") or 0))
        self.server.sealed_posts += 1
        worker = next((w for w in self.server.shown if w.key.key_id == self.headers.get(HEADER_KEY_ID)), None)
        if worker is None:
            self._send(409, b'{"error": {"message": "gone", "type": "invalid_request_error", "param": null, '
                            b'"code": "reattest_required"}}')
            return
        bearer = self.headers.get("Authorization", "").removeprefix("Bearer ")
        ctx = RequestContext(TENANT, self.headers[HEADER_MODEL], "/v1/chat/completions", worker.key.key_id,
                             version=VERSION, api_key_id=api_key_id(bearer),
                             policy_version=worker.workload.policy_version)
        self._send(200, worker.answer(ctx, wire), "application/sealed-response")


@contextmanager
def operator_gateway() -> Iterator[OperatorGateway]:
    gateway = OperatorGateway()
    threading.Thread(target=gateway.serve_forever, daemon=True).start()
    try:
        yield gateway
    finally:
        gateway.shutdown()
        gateway.server_close()


def genuine_issuer() -> TokenIssuer:
    """The genuine broker's token key (its JWKS is what the client pins)."""
    return TokenIssuer(ec.generate_private_key(ec.SECP256R1()), "sealed-key-broker", ttl=dt.timedelta(minutes=5))


def publisher_statement(publisher: Ed25519PrivateKey, measurements: list[str], serial: int = 1) -> dict[str, Any]:
    now = dt.datetime.now(dt.UTC)
    return sign_reference_values(publisher, measurements, tee="sim", issued_at=now - dt.timedelta(seconds=5),
                                 valid_for=dt.timedelta(days=1), serial=serial, promises=PROMISES)


def client_policy(platform: Ed25519PrivateKey, jwks: Mapping[str, Any], tenant: TenantKeys | None,
                  publisher: Ed25519PrivateKey | None = None, **extra: Any) -> dict[str, Any]:
    """The tenant's client policy: as `sealed up` writes it for the demo (no image of its own listed:
    the publisher's statement names them), pinning the tenant's key."""
    doc: dict[str, Any] = {
        "tenant": TENANT, "evidence": {"sim_platform_key": raw(platform).hex()},
        "appraisal": {"allowed_tee": ["sim"], "allowed_measurements": [] if publisher else [GENUINE],
                      "unsafe_allow_simulated_tee": True},
        "broker_jwks": dict(jwks), "require_promises": PROMISES, **extra}
    if publisher is not None:
        doc["reference_values"] = {"publisher_key": raw(publisher).hex()}
    if tenant is not None:
        doc.setdefault("tenant_keys", tenant.pin())
    return doc
