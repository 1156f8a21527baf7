"""One sealed request, start to end, sans-IO: the one implementation both transports drive
(sealed_client/transport.py; the steps and drivers are sealed_client/steps.py).

Route the request (refuse what cannot be sealed, pass through what carries nothing secret); serve a
Responses request with the file_search tool as two sealed exchanges (sealed_client/file_search.py);
for a call on stored state, ask the gateway which model's worker holds its key; pin that model's
worker (verified on first use and whenever the pin lapses); seal to it, send, and open the answer.
On `409 reattest_required` (the worker key changed or its worker left) the pin is dropped, the
deployment verified again, and the request sealed and sent once more with the newly verified key.
What is decided about a request and an answer is in sealed_client/sealing.py."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx2

from protocol.sealed import ReattestRequired
from sealed_client.deployment import PinnedKey
from sealed_client.file_search import file_search, serve
from sealed_client.routing import route_of
from sealed_client.sealing import (
    GatewayRefused,
    broker_answer,
    call_of,
    json_answer,
    plain_answer,
    sealed_request,
    unpinned,
)
from sealed_client.session import NoAttestedWorker, SealedSession
from sealed_client.steps import Flow, open_sealed, read, read_request, send
from sealed_client.stored_calls import body_to_seal, routed_model, routing_lookup

# A sealed request is sent at most this often: once, and once more after verifying the deployment again.
ATTEMPTS = 2


@dataclass(frozen=True)
class RequestFlow:
    """The flows of one transport: `handle` a request, `pin` a model's worker."""

    session: SealedSession
    gateway_url: str  # without a trailing slash
    unsafe_allow_plaintext: bool

    def _get_json(self, path: str, auth: str | None = None) -> Flow[dict[str, Any]]:
        headers = {"Authorization": auth} if auth else {}
        response = yield from send(httpx2.Request("GET", self.gateway_url + path, headers=headers))
        yield from read(response)
        return json_answer(path, response)

    def _optional(self, path: str) -> Flow[dict[str, Any] | None]:
        try:
            return (yield from self._get_json(path))
        except ReattestRequired:
            return None  # absent: the session refuses if it needs it

    def _broker_attestation(self, url: str, nonce: bytes) -> Flow[dict[str, Any]]:
        """The pinned key broker's attestation for `nonce` (straight to the broker, not the gateway)."""
        response = yield from send(httpx2.Request("POST", url, json={"nonce": nonce.hex()}))
        yield from read(response)
        return broker_answer(response)

    def pin(self, model: str, auth: str | None = None) -> Flow[PinnedKey]:
        """The verified worker for `model`; the attestation document is fetched with the request's own
        API key (the gateway shows each tenant only its own workers)."""
        session = self.session
        pin = session.pinned(model)
        if pin is None:
            if session.needs_jwks():
                session.set_gateway_jwks((yield from self._get_json("/.well-known/jwks.json")))
            challenge = session.broker_challenge()
            if challenge is not None:
                answer = yield from self._broker_attestation(challenge[0], challenge[1])
                session.set_broker_attestation(answer, challenge[1])
            refvals = ((yield from self._optional("/.well-known/reference-values"))
                       if session.wants_reference_values() else None)
            pin = session.pin_from(model, (yield from self._get_json("/.well-known/attestation", auth)), refvals)
        return pin

    def _routed(self, request: httpx2.Request, prefix: str, endpoint: str) -> Flow[str | httpx2.Response | None]:
        """For a call on stored state, the model whose worker holds its key (or the gateway's refusal);
        None for any other call (it names its model)."""
        lookup = routing_lookup(request, prefix, endpoint)
        if lookup is None:
            return None
        looked = yield from send(lookup)
        return routed_model(request, looked, (yield from read(looked)))

    def handle(self, request: httpx2.Request) -> Flow[httpx2.Response]:
        route = route_of(request, self.unsafe_allow_plaintext)
        if route is None:
            return (yield from send(request))
        prefix, endpoint = route
        plan = file_search(request, (yield from read_request(request)), endpoint)
        if isinstance(plan, httpx2.Response):
            return plan
        if plan is not None:
            return (yield from serve(request, plan, self.handle))
        routed = yield from self._routed(request, prefix, endpoint)
        if isinstance(routed, httpx2.Response):
            return routed
        body = body_to_seal(request, endpoint, (yield from read_request(request)), routed)
        if isinstance(body, httpx2.Response):
            return body
        call = call_of(self.session, request, body, prefix, endpoint)
        for attempt in range(ATTEMPTS):
            try:
                pin = yield from self.pin(call.model, request.headers.get("authorization"))
            except (GatewayRefused, NoAttestedWorker) as exc:
                return unpinned(exc, request)
            exchange, out = sealed_request(self.session, request, call, pin)
            response = yield from send(out)
            if self.session.is_sealed(response.headers.get("content-type", "")) and response.status_code == 200:
                return (yield from open_sealed(response, self.session.reader(exchange)))
            raw = yield from read(response)
            answer = plain_answer(self.session, request, response, raw, call.model, attempt)
            if answer is not None:
                return answer
        raise ReattestRequired("the pinned worker is gone")  # pragma: no cover - the last attempt returns or raises
