"""Hypothesis over what a worker sends the gateway (#35): the heartbeat body (with its settlement
batch of owed usage and sealed records) through the real route, and directly the parsers behind it:
signed usage records, the signed decision records and the sealed record from a call's gRPC
trailers. The worker is outside the gateway's trust, so mutated messages are also re-signed with the
worker's own key: a signature that verifies must not make a malformed payload a crash. Every answer
is a refusal (4xx, UsageRejected, an audited invalid record), never a 500 or an exception."""

from __future__ import annotations

import base64
import contextlib
import json
import random
from collections.abc import Iterator
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from fastapi.testclient import TestClient
from hypothesis import given
from hypothesis import strategies as st

from api.app import create_app
from api.gateway.audit import audit_worker_decisions
from api.gateway.grpc_client import _decision_records, _sealed_record
from api.gateway.metering import UsageRejected, verify_usage
from api.gateway.registry import WorkerInfo
from api.gateway.settings import GatewaySettings, WorkerRoute
from api.gateway.settlement import Settlement
from api.gateway.worker_attestation import expected_binding
from api.tenant_audit import decision_key_public_hex
from attestation.errors import FreshnessError
from policy.audit import AuditLog
from policy.audit.worker_record import DECISION_METADATA_KEY, KIND, public_key_bytes, sign_decision
from protocol.heartbeat import heartbeat_signing_input, worker_id_for
from protocol.model_ref import ModelRef
from protocol.rpc import worker_pb2
from protocol.sealed.decision_record import RECORD_METADATA_KEY, DecisionRecord, seal_decision_record
from protocol.tls import load_or_create
from tests.fuzzing import DEEP_JSON, budget, mutate, mutated
from tests.security.test_worker_identity import ISSUER, REGISTER_TOKEN, SCOPE, Worker

KEY = Ed25519PrivateKey.from_private_bytes(bytes(range(32)))
PUBLIC = public_key_bytes(KEY)
WORKER_ID = worker_id_for(PUBLIC)
USAGE = json.dumps({"request_id": "r1", "tenant": "acme", "key_id": "k1", "model": "m", "version": "v1",
                    "prompt_tokens": 12, "completion_tokens": 3, "worker_seconds": 0.25, "at": 1.7e9},
                   sort_keys=True, separators=(",", ":")).encode()
DECISION, _ = sign_decision(KEY, request_id="r1", tenant="acme", key_id="k1", model="m", version="v1",
                            action="content-input", decision="redact", rule="data.pii_input.EMAIL_ADDRESS",
                            policy_id="p", policy_version=3, at=1.7e9)
TENANT_KEY = X25519PrivateKey.from_private_bytes(bytes(range(1, 33)))
RECORD = seal_decision_record(
    DecisionRecord(WORKER_ID, "boot", 7, "r1", "acme", "k1", "m", "v1", 1.7e9,
                   ({"request_id": "r1", "action": "content-input", "decision": "deny", "rule": "data.pattern.x",
                     "policy_id": "p", "policy_version": 3, "at": 1.7e9},)),
    KEY, bytes.fromhex(decision_key_public_hex(TENANT_KEY)))


def _worker() -> WorkerInfo:
    return WorkerInfo(worker_id=WORKER_ID, grpc_address="127.0.0.1:1", ref=ModelRef("acme", "m", "v1"),
                      status="ready", tee="sim", insecure=True, usage_public_key=PUBLIC.hex())


def _signed(payload: bytes, domain: bytes = b"") -> worker_pb2.UsageRecord:
    return worker_pb2.UsageRecord(payload=payload, signature=KEY.sign(domain + payload), public_key=PUBLIC)


def _signed_decision(payload: bytes) -> worker_pb2.UsageRecord:
    return _signed(payload, KIND.encode() + b"\x00")  # policy/audit/worker_record.py's signing domain


@budget(200)
@given(mutated([USAGE, *DEEP_JSON, b"NaN", b"[1]", b'{"request_id": "r1", "tenant": "acme"}']), st.booleans())
def test_fuzz_signed_usage_payload(payload: bytes, owed: bool) -> None:
    with contextlib.suppress(UsageRejected):
        row = verify_usage(_signed(payload), _worker(), None if owed else "r1", "acme")
        assert row.tenant == "acme"
        assert isinstance(row.request_id, str) and 0 < len(row.request_id) <= 64  # a row the table takes


@pytest.mark.parametrize("request_id", [None, "", "r" * 65, 7, ["r1"], "absent"])
def test_an_owed_usage_record_without_a_valid_request_id_is_refused(request_id: Any) -> None:
    """Signed by the worker's own key, so only the content check stands between it and the usage
    table (whose request_id is NOT NULL): found by the heartbeat fuzz test as a 500."""
    doc = json.loads(USAGE)
    if request_id == "absent":
        del doc["request_id"]
    else:
        doc["request_id"] = request_id
    with pytest.raises(UsageRejected, match="no valid request id"):
        verify_usage(_signed(json.dumps(doc).encode()), _worker(), None, "acme")
    assert verify_usage(_signed(USAGE), _worker(), None, "acme").request_id == "r1"  # the valid record passes


@pytest.fixture(scope="module")
def audit(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AuditLog]:
    with AuditLog(tmp_path_factory.mktemp("audit") / "gateway.jsonl", KEY, "gateway", fsync="batch") as log:
        yield log


@budget(200)
@given(mutated([DECISION, *DEEP_JSON, DECISION.replace(b'"at":1700000000.0', b'"at":NaN')]),
       mutated([_signed_decision(DECISION).SerializeToString()]), st.booleans())
def test_fuzz_decision_trailers(audit: AuditLog, payload: bytes, wire: bytes, resign: bool) -> None:
    """Trailers as gRPC hands them over: the gateway parses each record, checks the pinned key and
    the signature, and audits it (a malformed one as invalid); nothing raises."""
    trailers = ((DECISION_METADATA_KEY, _signed_decision(payload).SerializeToString() if resign else wire),
                (DECISION_METADATA_KEY, wire), ("other-bin", wire), (RECORD_METADATA_KEY, wire))
    records = _decision_records(trailers)
    assert _sealed_record(trailers) == wire
    assert audit_worker_decisions(audit, records, pinned_key_hex=PUBLIC.hex(), request_id="r1", tenant="acme",
                                  worker_id=WORKER_ID) <= len(records)


@budget(150)
@given(mutated([RECORD]))
def test_fuzz_sealed_record(audit: AuditLog, wire: bytes) -> None:
    settlement = Settlement(audit, metering=None)  # type: ignore[arg-type]  # records never meter
    assert settlement.sealed_record(_worker(), wire, "r1") in (True, False)


@pytest.fixture(scope="module")
def tls_der(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    tmp = tmp_path_factory.mktemp("tls")
    load_or_create(tmp / "worker.key", tmp / "worker.pem")  # a worker's own gRPC certificate
    return x509.load_pem_x509_certificate((tmp / "worker.pem").read_bytes()).public_bytes(serialization.Encoding.DER)


@budget(150)
@given(st.data())
def test_fuzz_worker_tls_certificate(tls_der: bytes, data: st.DataObject) -> None:
    """The certificate a heartbeat names, read when the worker's attestation is checked (the token is
    public, so any registrant can pair a valid one with any certificate): refused, never a crash."""
    der = data.draw(mutated([tls_der]))
    pem = b"-----BEGIN CERTIFICATE-----\n" + base64.encodebytes(der) + b"-----END CERTIFICATE-----\n"
    with contextlib.suppress(FreshnessError):
        assert len(expected_binding(pem.decode(), PUBLIC.hex())) == 32


@pytest.mark.parametrize("version", [b"\x69", b"\x05", b"\xff"])
def test_a_certificate_with_an_invalid_version_is_a_typed_refusal_everywhere_it_is_read(
        tls_der: bytes, version: bytes) -> None:
    """cryptography raises InvalidVersion, which is no ValueError, for a version outside v1-v3: the
    fuzz test's find (2026-12-05). The gateway's binding check, the console's fingerprint and the
    client's pinning each turn it into their own answer."""
    from api.console.pages.workers import _cert_fingerprint
    from sealed_client.deployment import _spki

    v3 = b"\xa0\x03\x02\x01\x02"
    assert tls_der.count(v3) == 1
    der = tls_der.replace(v3, v3[:-1] + version)
    pem = (b"-----BEGIN CERTIFICATE-----\n" + base64.encodebytes(der) + b"-----END CERTIFICATE-----\n").decode()
    with pytest.raises(FreshnessError, match="cannot be read"):
        expected_binding(pem, PUBLIC.hex())
    assert _cert_fingerprint(pem) == "unreadable"
    with pytest.raises(FreshnessError, match="TLS certificate cannot be read"):
        _spki(pem)


# The heartbeat route, end to end: a real worker's signed body, with a batch of owed usage and records.

@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TestClient, Worker]]:
    tmp = tmp_path_factory.mktemp("gw")
    jwks = tmp / "jwks.json"
    jwks.write_text(json.dumps(ISSUER.jwks()))
    settings = GatewaySettings(data_dir=tmp / "gw", dev=True, register_token=REGISTER_TOKEN, jwt_secret="j" * 40,
                               broker_jwks=jwks, workers=(WorkerRoute(**SCOPE),))
    (tmp / "gw").mkdir()
    worker = Worker(tmp, 50051)
    with TestClient(create_app(settings), raise_server_exceptions=False) as client:
        assert _post(client, worker.beat()) == 200  # registered and attested: settlements are taken
        yield client, worker


def _post(client: TestClient, body: bytes | dict[str, Any]) -> int:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return client.post("/internal/workers/heartbeat", content=content,
                       headers={"Authorization": f"Bearer {REGISTER_TOKEN}",
                                "Content-Type": "application/json"}).status_code


def _settle(worker: Worker, rng: random.Random) -> dict[str, Any]:
    key = worker.state.usage_key
    usage = json.loads(USAGE) | {"request_id": f"r{rng.randrange(1 << 30)}"}
    payload = mutate(rng, json.dumps(usage).encode()) if rng.random() < 0.5 else json.dumps(usage).encode()
    record = RECORD if rng.random() < 0.5 else mutate(rng, RECORD)
    return {"usage": [{"payload": base64.b64encode(payload).decode(), "signature": key.sign(payload).hex()}],
            "records": [base64.b64encode(record).decode()]}


@budget(120)
@given(st.integers(0, 2**64), st.sampled_from(["settle", "body", "body-resigned"]))
def test_fuzz_heartbeat_route(gateway: tuple[TestClient, Worker], seed: int, how: str) -> None:
    """A signed heartbeat whose settlement batch holds mutated (signed) usage and records; or the
    whole body mutated, as sent or re-signed by the worker (so that mutated fields that pass the
    schema reach the registry and the attestation check): answered 2xx or 4xx, never 500."""
    client, worker = gateway
    rng = random.Random(seed)
    body = {k: v for k, v in worker.beat().items() if k != "signature"} | {"settle": _settle(worker, rng)}
    raw = json.dumps(_sign(worker, body)).encode()
    if how != "settle":
        raw = mutate(rng, raw)
    if how == "body-resigned":
        with contextlib.suppress(ValueError, RecursionError):
            doc = json.loads(raw)
            if isinstance(doc, dict):
                raw = json.dumps(_sign(worker, doc)).encode()
    assert _post(client, raw) < 500


def test_a_heartbeat_settling_usage_without_a_request_id_is_taken_and_the_record_refused(
        gateway: tuple[TestClient, Worker], caplog: pytest.LogCaptureFixture) -> None:
    """The heartbeat fuzz test's find (seed 101108, "settle"): a signed usage record whose request id
    is null reached the usage table and the heartbeat answered 500. Now the beat is taken and the
    record refused (metering logs it and stores nothing)."""
    client, worker = gateway
    key = worker.state.usage_key
    payload = json.dumps(json.loads(USAGE) | {"request_id": None}).encode()
    body = {k: v for k, v in worker.beat().items() if k != "signature"} | {
        "settle": {"usage": [{"payload": base64.b64encode(payload).decode(), "signature": key.sign(payload).hex()}],
                   "records": []}}
    assert _post(client, json.dumps(_sign(worker, body)).encode()) == 200
    assert "no valid request id" in caplog.text


def _sign(worker: Worker, body: dict[str, Any]) -> dict[str, Any]:
    body = {k: v for k, v in body.items() if k != "signature"}
    return body | {"signature": worker.state.usage_key.sign(heartbeat_signing_input(body)).hex()}


def test_a_signed_decision_with_a_non_finite_time_is_audited_as_invalid(audit: AuditLog) -> None:
    """It verified before and was logged with its time withheld, so the entry could never be
    re-verified (`verify_logged_decision`)."""
    nan = DECISION.replace(b'"at":1700000000.0', b'"at":NaN')
    assert nan != DECISION
    assert audit_worker_decisions(audit, [_signed_decision(nan)], pinned_key_hex=PUBLIC.hex(), request_id="r1",
                                  tenant="acme", worker_id=WORKER_ID) == 0
    assert audit_worker_decisions(audit, [_signed_decision(DECISION)], pinned_key_hex=PUBLIC.hex(),
                                  request_id="r1", tenant="acme", worker_id=WORKER_ID) == 1
