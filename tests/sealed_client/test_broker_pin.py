"""The client takes the key broker's token keys from the broker's own attestation, not from a file
or the gateway: a real broker (its app, on the simulated TEE) answers the client's fresh nonce, and
every answer that does not verify under the tenant's pin is refused with nothing pinned (a table)."""

from __future__ import annotations

import base64
import secrets
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from cryptography.hazmat.primitives import serialization

from attestation.appraisal import AppraisalPolicy
from attestation.errors import AttestationError, BrokerIdentityError, FreshnessError, SignatureError
from sealed_client.broker_pin import BrokerPin
from sealed_client.deployment import ClientTrust
from sealed_client.session import NoAttestedWorker, SealedSession
from sealed_client.transport import SealedTransport
from tests.key_broker.conftest import Clock, Harness

BROKER = "http://broker.test"


@pytest.fixture()
def kb(tmp_path: Path) -> Iterator[Harness]:
    """A real key broker (tests/key_broker's harness: its app, on the simulated TEE)."""
    harness = Harness(tmp_path / "kb", Clock())
    yield harness
    harness.close()


def _measurement(kb: Harness) -> str:
    assert kb.service.attested is not None
    return kb.service.attested.platform.measurement.hex()


def _trust(kb: Harness, **pin: Any) -> ClientTrust:
    platform = serialization.load_pem_private_key(kb.broker_platform.read_bytes(), None)
    raw = platform.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    fields: dict[str, Any] = {"url": BROKER, "tee": frozenset({"sim"}), "measurements": frozenset({_measurement(kb)})}
    fields.update(pin)
    return ClientTrust(appraisal=AppraisalPolicy(allowed_tee=frozenset({"sim"}), unsafe_allow_simulated_tee=True),
                       unsafe_no_tenant_key=True, tenant="acme", broker=BrokerPin(**fields), sim_platform_key=raw)


def _session(kb: Harness, **pin: Any) -> SealedSession:
    return SealedSession(_trust(kb, **pin), clock=lambda: kb.clock())


def _answer(kb: Harness, nonce: bytes) -> dict[str, Any]:
    r = kb.client.post("/v1/broker/attestation", json={"nonce": nonce.hex()})
    assert r.status_code == 200, r.text
    return dict(r.json())


def test_the_attested_brokers_token_keys_are_taken(kb: Harness) -> None:
    session = _session(kb)
    assert not session.needs_jwks()  # the gateway's JWKS is never asked for
    challenge = session.broker_challenge()
    assert challenge is not None and challenge[0] == f"{BROKER}/v1/broker/attestation"
    session.set_broker_attestation(_answer(kb, challenge[1]), challenge[1])
    assert session.broker_challenge() is None  # kept until BROKER_TTL_S
    assert session._jwks == kb.client.get("/.well-known/jwks.json").json()
    session.set_gateway_jwks({"keys": []})  # a gateway's keys change nothing
    assert session._jwks == kb.client.get("/.well-known/jwks.json").json()


def _flip_evidence(answer: dict[str, Any]) -> None:
    raw = bytearray(base64.b64decode(answer["evidence"]["cpu_evidence"]))
    raw[-1] ^= 1
    answer["evidence"]["cpu_evidence"] = base64.b64encode(bytes(raw)).decode()


def _swap_jwks(answer: dict[str, Any]) -> None:
    answer["identity"]["token_jwks"]["keys"][0]["x"] = base64.urlsafe_b64encode(bytes(32)).decode().rstrip("=")


CASES: dict[str, tuple[dict[str, Any], Callable[[dict[str, Any]], None] | None, str, type[Exception]]] = {
    "another broker build": ({"measurements": frozenset({"cd" * 48})}, None, "not a pinned one",
                             BrokerIdentityError),
    "another TEE pinned": ({"tee": frozenset({"snp"})}, None, "not on a pinned TEE", BrokerIdentityError),
    "a flipped evidence byte": ({}, _flip_evidence, "signature", SignatureError),
    "the operator's token keys in the document": ({}, _swap_jwks, "binds another", FreshnessError),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_an_answer_that_does_not_verify_pins_nothing(kb: Harness, case: str) -> None:
    pin, tamper, match, error = CASES[case]
    session = _session(kb, **pin)
    challenge = session.broker_challenge()
    assert challenge is not None
    answer = _answer(kb, challenge[1])
    if tamper is not None:
        tamper(answer)
    with pytest.raises(error, match=match):
        session.set_broker_attestation(answer, challenge[1])
    assert session._jwks is None and session.broker_challenge() is not None
    with pytest.raises(AttestationError, match="no key broker JWKS"):
        session.pin_from("m", {"workers": []})


def test_a_replayed_answer_for_another_nonce_is_refused(kb: Harness) -> None:
    session = _session(kb)
    challenge = session.broker_challenge()
    assert challenge is not None
    with pytest.raises(FreshnessError):
        session.set_broker_attestation(_answer(kb, secrets.token_bytes(32)), challenge[1])


def test_a_broker_issuing_under_another_name_is_refused(kb: Harness) -> None:
    trust = _trust(kb)
    session = SealedSession(ClientTrust(**{**trust.__dict__, "broker_issuer": "another-broker"}),
                            clock=lambda: kb.clock())
    challenge = session.broker_challenge()
    assert challenge is not None
    with pytest.raises(BrokerIdentityError, match="issues tokens as"):
        session.set_broker_attestation(_answer(kb, challenge[1]), challenge[1])


class _Network(httpx2.BaseTransport):
    """The broker (its real app) and a gateway that shows no worker, as the client sees them."""

    def __init__(self, kb: Harness, broker_status: int | None = None) -> None:
        self.kb, self.broker_status = kb, broker_status
        self.seen: list[str] = []

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        self.seen.append(f"{request.method} {request.url}")
        if str(request.url).startswith(BROKER):
            if self.broker_status is not None:
                return httpx2.Response(self.broker_status, json={"error": "no"}, request=request)
            r = self.kb.client.post(request.url.path, content=request.read(),
                                    headers={"Content-Type": "application/json"})
            return httpx2.Response(r.status_code, content=r.content, request=request,
                                   headers={"Content-Type": "application/json"})
        if request.url.path == "/.well-known/attestation":
            return httpx2.Response(200, json={"workers": []}, request=request)
        return httpx2.Response(404, json={}, request=request)


def test_the_transport_asks_the_broker_before_the_gateway(kb: Harness) -> None:
    network = _Network(kb)
    session = _session(kb)
    transport = SealedTransport(session, "http://gateway.test", inner=network)
    with pytest.raises(NoAttestedWorker):  # the gateway shows no worker: the broker was verified first
        transport.pin("m")
    assert network.seen[0] == f"POST {BROKER}/v1/broker/attestation"
    assert not any("jwks.json" in s for s in network.seen)
    assert session._jwks == kb.client.get("/.well-known/jwks.json").json()


def test_a_broker_that_does_not_attest_stops_the_client(kb: Harness) -> None:
    network = _Network(kb, broker_status=503)
    transport = SealedTransport(_session(kb), "http://gateway.test", inner=network)
    with pytest.raises(BrokerIdentityError, match="did not attest itself"):
        transport.pin("m")
    assert not any("/.well-known/attestation" in s for s in network.seen)  # nothing asked of the gateway


def test_the_policy_file_pins_the_broker() -> None:
    doc = {"tenant": "acme", "unsafe_no_tenant_key": True,
           "appraisal": {"allowed_tee": ["snp"], "allowed_measurements": ["aa" * 48]},
           "broker": {"url": "https://broker.example", "tee": "snp", "measurements": ["AB" * 48]}}
    trust = ClientTrust.from_dict(doc)
    assert trust.attests_broker and trust.broker is not None
    assert trust.broker.measurements == {"ab" * 48} and trust.broker.tee == {"snp"}
    with pytest.raises(ValueError, match="pin the key broker"):
        ClientTrust.from_dict({**doc, "broker": {"tee": "snp", "measurements": ["ab" * 48]}})  # no URL, no JWKS
    with pytest.raises(AttestationError, match="unknown broker keys"):
        ClientTrust.from_dict({**doc, "broker": {**doc["broker"], "jwks": {}}})
    with pytest.raises(AttestationError, match="at least one broker measurement"):
        ClientTrust.from_dict({**doc, "broker": {"url": "https://broker.example", "measurements": []}})

