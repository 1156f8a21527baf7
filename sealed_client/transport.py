"""httpx2 transports (the HTTP library the openai SDK uses) that seal chat, completion, Responses API
and embeddings requests (protocol/sealed/http.py::ENDPOINTS), and file uploads and vector store
searches (RETRIEVAL_ENDPOINTS, in the sealed forms of sealed_client/retrieval.py); a Responses
request with the file_search tool becomes a sealed search, then a sealed response
(sealed_client/file_search.py).

A request the client cannot seal is refused with `UnsealedRequest` before anything is sent (any
other endpoint, e.g. `moderations.create`; a base URL without `/v1`, whose paths do not end in a
sealed endpoint), unless the transport was made with `unsafe_allow_plaintext` (logged). Only a
`GET` of the model list, a `DELETE` of a stored response or a conversation, and the file and vector
store calls that carry only ids, names, metadata, attributes and status pass through: they carry nothing
the gateway does not keep in clear anyway. Reading a stored response back and every other Conversations
API call are sealed too, as calls on stored state (stored_calls.py: the gateway names the model to pin). A
sealed request goes only to the pinned worker; on `409 reattest_required` the transport verifies the
deployment again and retries once with the newly verified key. Plaintext successes, unverifiable
answers and bad receipts raise typed errors (protocol.sealed / attestation), which the openai SDK
passes through unwrapped.

This module does the I/O, routing, pinning and the one retry; what is decided about a request and
an answer is in sealed_client/sealing.py, opening the sealed answer in sealed_client/opening.py.
"""

from __future__ import annotations

from typing import Any

import httpx2

from protocol.sealed import ReattestRequired
from sealed_client.deployment import PinnedKey
from sealed_client.file_search import file_search, serve, serve_async
from sealed_client.opening import open_answer, open_answer_async
from sealed_client.routing import route_of as _route
from sealed_client.routing import warn_plaintext
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
from sealed_client.stored_calls import body_to_seal, routed_model, routing_lookup


class SealedTransport(httpx2.BaseTransport):
    def __init__(self, session: SealedSession, gateway_url: str, inner: httpx2.BaseTransport | None = None, *,
                 unsafe_allow_plaintext: bool = False) -> None:
        self.session, self.gateway_url = session, gateway_url.rstrip("/")
        self._inner = inner or httpx2.HTTPTransport()
        self.unsafe_allow_plaintext = warn_plaintext(unsafe_allow_plaintext)

    def _get_json(self, path: str, auth: str | None = None) -> dict[str, Any]:
        headers = {"Authorization": auth} if auth else {}
        response = self._inner.handle_request(httpx2.Request("GET", self.gateway_url + path, headers=headers))
        try:
            response.read()
            return json_answer(path, response)
        finally:
            response.close()

    def _optional(self, path: str) -> dict[str, Any] | None:
        try:
            return self._get_json(path)
        except ReattestRequired:
            return None  # absent: the session refuses if it needs it

    def _post_broker(self, url: str, nonce: bytes) -> dict[str, Any]:
        """The pinned key broker's attestation for `nonce` (straight to the broker, not the gateway)."""
        response = self._inner.handle_request(httpx2.Request("POST", url, json={"nonce": nonce.hex()}))
        try:
            response.read()
            return broker_answer(response)
        finally:
            response.close()

    def pin(self, model: str, auth: str | None = None) -> PinnedKey:
        """The verified worker for `model`; the attestation document is fetched with the request's own
        API key (the gateway shows each tenant only its own workers)."""
        pin = self.session.pinned(model)
        if pin is None:
            if self.session.needs_jwks():
                self.session.set_gateway_jwks(self._get_json("/.well-known/jwks.json"))
            challenge = self.session.broker_challenge()
            if challenge is not None:
                self.session.set_broker_attestation(self._post_broker(challenge[0], challenge[1]), challenge[1])
            refvals = self._optional("/.well-known/reference-values") if self.session.wants_reference_values() else None
            pin = self.session.pin_from(model, self._get_json("/.well-known/attestation", auth), refvals)
        return pin

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        route = _route(request, self.unsafe_allow_plaintext)
        if route is None:
            return self._inner.handle_request(request)
        prefix, endpoint = route
        plan = file_search(request, request.read(), endpoint)
        if isinstance(plan, httpx2.Response):
            return plan
        if plan is not None:
            return serve(request, plan, self.handle_request)
        routed: str | None = None
        lookup = routing_lookup(request, prefix, endpoint)
        if lookup is not None:  # a call on stored state: which model's worker holds its key
            looked = self._inner.handle_request(lookup)
            try:
                found = routed_model(request, looked, looked.read())
            finally:
                looked.close()
            if isinstance(found, httpx2.Response):
                return found
            routed = found
        body = body_to_seal(request, endpoint, request.read(), routed)
        if isinstance(body, httpx2.Response):
            return body
        call = call_of(self.session, request, body, prefix, endpoint)
        model = call.model
        for attempt in range(2):
            try:
                pin = self.pin(model, request.headers.get("authorization"))
            except (GatewayRefused, NoAttestedWorker) as exc:
                return unpinned(exc, request)
            exchange, out = sealed_request(self.session, request, call, pin)
            response = self._inner.handle_request(out)
            if self.session.is_sealed(response.headers.get("content-type", "")) and response.status_code == 200:
                return open_answer(self.session, response, exchange)
            raw = response.read()
            response.close()
            answer = plain_answer(self.session, request, response, raw, model, attempt)
            if answer is not None:
                return answer
        raise ReattestRequired("the pinned worker is gone")  # pragma: no cover - loop always returns

    def close(self) -> None:
        self._inner.close()


class AsyncSealedTransport(httpx2.AsyncBaseTransport):
    def __init__(self, session: SealedSession, gateway_url: str,
                 inner: httpx2.AsyncBaseTransport | None = None, *, unsafe_allow_plaintext: bool = False) -> None:
        self.session, self.gateway_url = session, gateway_url.rstrip("/")
        self._inner = inner or httpx2.AsyncHTTPTransport()
        self.unsafe_allow_plaintext = warn_plaintext(unsafe_allow_plaintext)

    async def _get_json(self, path: str, auth: str | None = None) -> dict[str, Any]:
        headers = {"Authorization": auth} if auth else {}
        response = await self._inner.handle_async_request(httpx2.Request("GET", self.gateway_url + path,
                                                                          headers=headers))
        try:
            await response.aread()
            return json_answer(path, response)
        finally:
            await response.aclose()

    async def _optional(self, path: str) -> dict[str, Any] | None:
        try:
            return await self._get_json(path)
        except ReattestRequired:
            return None

    async def _post_broker(self, url: str, nonce: bytes) -> dict[str, Any]:
        response = await self._inner.handle_async_request(httpx2.Request("POST", url, json={"nonce": nonce.hex()}))
        try:
            await response.aread()
            return broker_answer(response)
        finally:
            await response.aclose()

    async def pin(self, model: str, auth: str | None = None) -> PinnedKey:
        pin = self.session.pinned(model)
        if pin is None:
            if self.session.needs_jwks():
                self.session.set_gateway_jwks(await self._get_json("/.well-known/jwks.json"))
            challenge = self.session.broker_challenge()
            if challenge is not None:
                answer = await self._post_broker(challenge[0], challenge[1])
                self.session.set_broker_attestation(answer, challenge[1])
            refvals = (await self._optional("/.well-known/reference-values")
                       if self.session.wants_reference_values() else None)
            pin = self.session.pin_from(model, await self._get_json("/.well-known/attestation", auth), refvals)
        return pin

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        route = _route(request, self.unsafe_allow_plaintext)
        if route is None:
            return await self._inner.handle_async_request(request)
        prefix, endpoint = route
        plan = file_search(request, await request.aread(), endpoint)
        if isinstance(plan, httpx2.Response):
            return plan
        if plan is not None:
            return await serve_async(request, plan, self.handle_async_request)
        routed: str | None = None
        lookup = routing_lookup(request, prefix, endpoint)
        if lookup is not None:
            looked = await self._inner.handle_async_request(lookup)
            try:
                found = routed_model(request, looked, await looked.aread())
            finally:
                await looked.aclose()
            if isinstance(found, httpx2.Response):
                return found
            routed = found
        body = body_to_seal(request, endpoint, await request.aread(), routed)
        if isinstance(body, httpx2.Response):
            return body
        call = call_of(self.session, request, body, prefix, endpoint)
        model = call.model
        for attempt in range(2):
            try:
                pin = await self.pin(model, request.headers.get("authorization"))
            except (GatewayRefused, NoAttestedWorker) as exc:
                return unpinned(exc, request)
            exchange, out = sealed_request(self.session, request, call, pin)
            response = await self._inner.handle_async_request(out)
            if self.session.is_sealed(response.headers.get("content-type", "")) and response.status_code == 200:
                return await open_answer_async(self.session, response, exchange)
            raw = await response.aread()
            await response.aclose()
            answer = plain_answer(self.session, request, response, raw, model, attempt)
            if answer is not None:
                return answer
        raise ReattestRequired("the pinned worker is gone")  # pragma: no cover

    async def aclose(self) -> None:
        await self._inner.aclose()
