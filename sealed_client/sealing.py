"""What the transports (sealed_client/transport.py) decide, once for sync and async: the sealed
request to send and what a plaintext answer to it means.

The gateway's own refusal of the caller (a bad API key) passes to the SDK unchanged; a well-known
document that is not there means "verify again"; a broker that does not attest itself stops the
request before anything is sent.
"""

from __future__ import annotations

import json
from typing import Any

import httpx2

from attestation.errors import BrokerIdentityError
from protocol.sealed import ReattestRequired
from protocol.sealed.http import RETRIEVAL_ENDPOINTS
from sealed_client.answer import Exchange
from sealed_client.deployment import PinnedKey
from sealed_client.retrieval import SealedCall, sealed_call
from sealed_client.session import NoAttestedWorker, SealedSession


class GatewayRefused(Exception):
    """The gateway refused the caller itself (a bad API key): its answer goes to the SDK unchanged, so
    the caller sees the same AuthenticationError it would in plaintext mode."""

    def __init__(self, status: int, headers: httpx2.Headers, content: bytes) -> None:
        super().__init__(status)
        self.status, self.headers, self.content = status, headers, content

    def response(self, request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(self.status, headers=self.headers, content=self.content, request=request)


def json_answer(path: str, response: httpx2.Response) -> dict[str, Any]:
    """A well-known document (already read): the caller's refusal passes through, anything but 200
    means "verify again"."""
    if response.status_code in (401, 403):
        raise GatewayRefused(response.status_code, response.headers, response.content)
    if response.status_code != 200:
        raise ReattestRequired(f"{path} answered {response.status_code}")
    doc = response.json()
    if not isinstance(doc, dict):
        raise ReattestRequired(f"{path} answered with something other than a JSON object")
    return doc


def broker_answer(response: httpx2.Response) -> dict[str, Any]:
    """The broker's attestation answer (already read); any other answer refuses: nothing is sent."""
    if response.status_code != 200:
        raise BrokerIdentityError(f"the key broker did not attest itself (HTTP {response.status_code})")
    try:
        doc = response.json()
    except ValueError as exc:
        raise BrokerIdentityError("the key broker's attestation answer is not JSON") from exc
    if not isinstance(doc, dict):
        raise BrokerIdentityError("the key broker's attestation answer is not a JSON object")
    return doc


def unpinned(exc: GatewayRefused | NoAttestedWorker, request: httpx2.Request) -> httpx2.Response:
    """The answer when no worker could be pinned: the gateway's refusal as is, or a 404."""
    if isinstance(exc, GatewayRefused):
        return exc.response(request)
    return httpx2.Response(404, json=exc.as_response_body(), request=request)


def _model_of(body: bytes) -> str:
    try:
        model = json.loads(body).get("model")
    except (ValueError, AttributeError):
        model = None
    if not isinstance(model, str) or not model:
        raise ValueError("a sealed request names its model")
    return model


def _api_key(request: httpx2.Request) -> str:
    """The API key the request is sent with (its id is bound into the sealed request)."""
    scheme, _, key = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not key.strip():
        raise ValueError("a sealed request carries its API key (Authorization: Bearer ...)")
    return key.strip()


def call_of(session: SealedSession, request: httpx2.Request, body: bytes, prefix: str, endpoint: str) -> SealedCall:
    """What to seal, to which model's worker, posted where (retrieval's forms: sealed_client/retrieval.py)."""
    if endpoint in RETRIEVAL_ENDPOINTS:
        return sealed_call(request, body, endpoint, session.retrieval_model)
    return SealedCall(endpoint, body, _model_of(body), session.sealed_url_path(prefix, endpoint))


def sealed_request(session: SealedSession, request: httpx2.Request, call: SealedCall, pin: PinnedKey
                   ) -> tuple[Exchange, httpx2.Request]:
    """The call sealed to the pinned worker's key, as the request to post in place of the caller's."""
    exchange = session.seal(pin, call.endpoint, call.body, _api_key(request))
    out = httpx2.Request("POST", request.url.copy_with(path=call.path, query=None),
                         headers=session.sealed_headers(exchange, request.headers),
                         content=exchange.sealed.wire, extensions=request.extensions)
    return exchange, out


def plain_answer(session: SealedSession, request: httpx2.Request, response: httpx2.Response, raw: bytes,
                 model: str, attempt: int) -> httpx2.Response | None:
    """A plaintext answer to a sealed request: an error to raise, None to verify again and retry
    (once), or the gateway's own answer (a refusal) to hand back."""
    error = session.plain_error(response.status_code, response.headers.get("content-type", ""), raw)
    if isinstance(error, ReattestRequired) and attempt == 0:
        session.forget(model)  # the key changed or its worker left: verify again
        return None
    if error is not None:
        raise error
    return httpx2.Response(response.status_code, headers=response.headers, content=raw, request=request)
