"""The gateway routes only to workers whose broker-signed attestation (as the worker submitted it in
its signed heartbeats) binds their channel keys and describes the evidence submitted beside it."""

from __future__ import annotations

import datetime as dt
import os

import pytest
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from api.gateway.registry import WorkerRegistry
from api.gateway.worker_attestation import expected_binding, verify_worker_attestation
from attestation.bundle import EvidenceBundle, RuntimeData
from attestation.errors import FreshnessError, TokenError
from attestation.token import TokenIssuer, TokenVerifier
from protocol.model_ref import ModelRef
from protocol.tls import make_identity

NOW = dt.datetime.now(dt.UTC)
SCOPE = {"tenant": "acme", "model": "m", "version": "v1"}


@pytest.fixture(scope="module")
def worker_keys() -> tuple[str, str]:
    cert = make_identity().cert_pem.decode()
    usage = Ed25519PrivateKey.generate().public_key().public_bytes(Encoding.Raw, PublicFormat.Raw).hex()
    return cert, usage


EVIDENCE = EvidenceBundle(tee="sim", cpu_evidence=b"report", runtime_data=RuntimeData(os.urandom(32), os.urandom(32)))


def token(issuer: TokenIssuer, binding: bytes, scope: dict | None = None,
          evidence: EvidenceBundle = EVIDENCE) -> str:
    return issuer.issue({"sealed": scope or SCOPE, "evidence_digest": evidence.digest(),
                         "runtime_data": {"channel_binding": binding.hex(), "nonce": os.urandom(32).hex()}}, NOW)


def check(tok: str, verifier: TokenVerifier, keys: tuple[str, str], evidence: EvidenceBundle = EVIDENCE) -> None:
    verify_worker_attestation({"token": tok, "evidence": evidence.to_json()}, ModelRef(**SCOPE), tls_cert=keys[0],
                              usage_public_key=keys[1], verifier=verifier)


def test_bound_worker_is_accepted(worker_keys: tuple[str, str]) -> None:
    issuer = TokenIssuer(ec.generate_private_key(ec.SECP256R1()), "sealed-key-broker")
    check(token(issuer, expected_binding(*worker_keys)), TokenVerifier(issuer.jwks(), "sealed-key-broker"),
          worker_keys)


def _other_keys() -> tuple[str, str]:
    return make_identity().cert_pem.decode(), os.urandom(32).hex()


NEGATIVES = [
    ("other-tls-key", lambda i, k: token(i, expected_binding(_other_keys()[0], k[1])), FreshnessError),
    ("other-usage-key", lambda i, k: token(i, expected_binding(k[0], os.urandom(32).hex())), FreshnessError),
    ("no-binding", lambda i, k: token(i, b""), FreshnessError),
    ("other-model", lambda i, k: token(i, expected_binding(*k), {**SCOPE, "model": "x"}), TokenError),
    ("other-broker", lambda i, k: token(TokenIssuer(ec.generate_private_key(ec.SECP256R1()), "sealed-key-broker"),
                                        expected_binding(*k)), TokenError),
    ("garbage", lambda i, k: "not-a-token", TokenError),
    ("other-evidence", lambda i, k: token(i, expected_binding(*k), evidence=EvidenceBundle(
        tee="sim", cpu_evidence=b"other", runtime_data=EVIDENCE.runtime_data)), FreshnessError),
]


@pytest.mark.parametrize(("name", "make", "error"), NEGATIVES, ids=[n[0] for n in NEGATIVES])
def test_unbound_worker_is_refused(worker_keys: tuple[str, str], name: str, make, error: type) -> None:  # type: ignore[no-untyped-def]
    issuer = TokenIssuer(ec.generate_private_key(ec.SECP256R1()), "sealed-key-broker")
    with pytest.raises(error):
        check(make(issuer, worker_keys), TokenVerifier(issuer.jwks(), "sealed-key-broker"), worker_keys)


def test_registry_hides_unattested_workers_when_attestation_is_required() -> None:
    registry = WorkerRegistry(require_attestation=True)
    doc = {"worker_id": "w1", "grpc_address": "x:1", "tenant": "acme", "model": "m",
           "version": "v1", "status": "ready", "tee": "sim", "insecure": True, "usage_public_key": "00"}
    info = registry.heartbeat(doc)
    assert registry.ready("acme", "m") == []
    info.attested = True
    assert registry.ready("acme", "m") == [info]
