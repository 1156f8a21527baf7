"""What the transports decide about a request and a plaintext answer (sealed_client/sealing.py),
without a gateway: the caller's own refusal passes through unchanged, a missing or malformed
well-known document means "verify again", a broker that does not attest itself stops the request,
and a request that names no model or carries no API key is refused before anything is sealed."""

from __future__ import annotations

from typing import Any

import httpx2
import pytest

from attestation.errors import BrokerIdentityError
from protocol.sealed import ReattestRequired
from sealed_client.sealing import GatewayRefused, broker_answer, call_of, json_answer, unpinned
from sealed_client.session import NoAttestedWorker

REQUEST = httpx2.Request("POST", "http://gateway.test/v1/chat/completions")


def _answer(status: int, **kwargs: Any) -> httpx2.Response:
    return httpx2.Response(status, request=REQUEST, **kwargs)


def test_a_well_known_document_is_returned_as_is() -> None:
    assert json_answer("/.well-known/attestation", _answer(200, json={"workers": []})) == {"workers": []}


@pytest.mark.parametrize("status", [401, 403])
def test_the_gateway_refusing_the_caller_reaches_the_sdk_unchanged(status: int) -> None:
    refused = _answer(status, json={"error": {"code": "invalid_api_key"}}, headers={"x-request-id": "r1"})
    with pytest.raises(GatewayRefused) as caught:
        json_answer("/.well-known/attestation", refused)
    passed = unpinned(caught.value, REQUEST)
    assert passed.status_code == status
    assert passed.headers["x-request-id"] == "r1"
    assert passed.content == refused.content


@pytest.mark.parametrize("answer", [_answer(404), _answer(500, text="oops"), _answer(200, json=["not", "an object"])])
def test_anything_else_than_a_document_means_verify_again(answer: httpx2.Response) -> None:
    with pytest.raises(ReattestRequired):
        json_answer("/.well-known/attestation", answer)


def test_no_attested_worker_is_openais_404() -> None:
    answer = unpinned(NoAttestedWorker("m"), REQUEST)
    assert answer.status_code == 404
    assert answer.json()["error"]["code"] == "model_not_found"


def test_the_brokers_attestation_is_returned_as_is() -> None:
    assert broker_answer(_answer(200, json={"evidence": "e"})) == {"evidence": "e"}


@pytest.mark.parametrize("answer", [_answer(503), _answer(200, text="not json"), _answer(200, json=[1, 2])])
def test_a_broker_that_does_not_attest_itself_stops_the_request(answer: httpx2.Response) -> None:
    with pytest.raises(BrokerIdentityError):
        broker_answer(answer)


@pytest.mark.parametrize("body", [b"{}", b'{"model": ""}', b'{"model": 3}', b"[]", b"not json"])
def test_a_request_that_names_no_model_is_refused_before_sealing(body: bytes) -> None:
    with pytest.raises(ValueError, match="names its model"):
        call_of(None, REQUEST, body, "", "/v1/chat/completions")  # type: ignore[arg-type]  # never reached
