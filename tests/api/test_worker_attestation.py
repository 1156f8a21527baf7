"""The gateway routes only to workers whose broker-signed attestation binds their channel keys."""

from __future__ import annotations

import datetime as dt
import os

import httpx
import pytest
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from api.gateway.registry import WorkerRegistry
from api.gateway.worker_attestation import expected_binding, verify_worker
from attestation.errors import FreshnessError, TokenError
from attestation.token import TokenIssuer, TokenVerifier
from protocol.tls import make_identity

NOW = dt.datetime.now(dt.UTC)
SCOPE = {"tenant": "acme", "model": "m", "version": "v1"}


@pytest.fixture(scope="module")
def worker_keys() -> tuple[str, str]:
    cert = make_identity().cert_pem.decode()
    usage = Ed25519PrivateKey.generate().public_key().public_bytes(Encoding.Raw, PublicFormat.Raw).hex()
    return cert, usage


def serve_token(token: str) -> httpx.Client:
    return httpx.Client(transport=httpx.MockTransport(lambda _: httpx.Response(200, json={"token": token})))


def token(issuer: TokenIssuer, binding: bytes, scope: dict | None = None) -> str:
    return issuer.issue({"sealed": scope or SCOPE, "runtime_data": {"channel_binding": binding.hex(),
                                                                     "nonce": os.urandom(32).hex()}}, NOW)


def check(tok: str, verifier: TokenVerifier, keys: tuple[str, str]) -> None:
    verify_worker("http://worker", **SCOPE, tls_cert=keys[0], usage_public_key=keys[1], verifier=verifier,
                  client=serve_token(tok))


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
]


@pytest.mark.parametrize(("name", "make", "error"), NEGATIVES, ids=[n[0] for n in NEGATIVES])
def test_unbound_worker_is_refused(worker_keys: tuple[str, str], name: str, make, error: type) -> None:  # type: ignore[no-untyped-def]
    issuer = TokenIssuer(ec.generate_private_key(ec.SECP256R1()), "sealed-key-broker")
    with pytest.raises(error):
        check(make(issuer, worker_keys), TokenVerifier(issuer.jwks(), "sealed-key-broker"), worker_keys)


def test_registry_hides_unattested_workers_when_attestation_is_required() -> None:
    registry = WorkerRegistry(require_attestation=True)
    doc = {"worker_id": "w1", "grpc_address": "x", "http_url": "y", "tenant": "acme", "model": "m",
           "version": "v1", "status": "ready", "tee": "sim", "insecure": True, "usage_public_key": "00"}
    info = registry.heartbeat(doc)
    assert registry.ready("acme", "m") == []
    info.attested = True
    assert registry.ready("acme", "m") == [info]
