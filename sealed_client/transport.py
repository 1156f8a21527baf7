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
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx2

from attestation.errors import BrokerIdentityError
from protocol.sealed import ReattestRequired
from protocol.sealed.http import RETRIEVAL_ENDPOINTS
from sealed_client.file_search import file_search, serve, serve_async
from sealed_client.retrieval import SealedCall, sealed_call
from sealed_client.routing import route_of as _route
from sealed_client.routing import warn_plaintext
from sealed_client.session import (
    RECEIPT_HEADER,
    AnswerReader,
    Exchange,
    NoAttestedWorker,
    SealedSession,
)
from sealed_client.stored_calls import body_to_seal, routed_model, routing_lookup


def _model_of(body: bytes) -> str:
    try:
        model = json.loads(body).get("model")
    except (ValueError, AttributeError):
        model = None
    if not isinstance(model, str) or not model:
        raise ValueError("a sealed request names its model")
    return model


_SSE_DONE = b"data: [DONE]\n\n"


def _release(part: bytes, held: list[bytes]) -> list[bytes]:
    """The stream's end marker is held back until the receipt has been checked: an SDK that stops
    reading at [DONE] would otherwise never see (or check) the receipt."""
    if part == _SSE_DONE:
        held.append(part)
        return []
    return [part]


class _GatewayRefused(Exception):
    """The gateway refused the caller itself (a bad API key): its answer goes to the SDK unchanged, so
    the caller sees the same AuthenticationError it would in plaintext mode."""

    def __init__(self, status: int, headers: httpx2.Headers, content: bytes) -> None:
        super().__init__(status)
        self.status, self.headers, self.content = status, headers, content

    def response(self, request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(self.status, headers=self.headers, content=self.content, request=request)


# The sync and async transports differ only in how they wait; what they decide is here, once.

def _json_answer(path: str, response: httpx2.Response) -> dict[str, Any]:
    """A well-known document (already read): the caller's refusal passes through, anything but 200
    means "verify again"."""
    if response.status_code in (401, 403):
        raise _GatewayRefused(response.status_code, response.headers, response.content)
    if response.status_code != 200:
        raise ReattestRequired(f"{path} answered {response.status_code}")
    doc = response.json()
    if not isinstance(doc, dict):
        raise ReattestRequired(f"{path} answered with something other than a JSON object")
    return doc


def _broker_answer(response: httpx2.Response) -> dict[str, Any]:
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


def _unpinned(exc: Exception, request: httpx2.Request) -> httpx2.Response:
    """The answer when no worker could be pinned: the gateway's refusal as is, or a 404."""
    if isinstance(exc, _GatewayRefused):
        return exc.response(request)
    assert isinstance(exc, NoAttestedWorker)
    return httpx2.Response(404, json=exc.as_response_body(), request=request)


def _api_key(request: httpx2.Request) -> str:
    """The API key the request is sent with (its id is bound into the sealed request)."""
    scheme, _, key = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not key.strip():
        raise ValueError("a sealed request carries its API key (Authorization: Bearer ...)")
    return key.strip()


def _call(session: SealedSession, request: httpx2.Request, body: bytes, prefix: str, endpoint: str) -> SealedCall:
    """What to seal, to which model's worker, posted where (retrieval's forms: sealed_client/retrieval.py)."""
    if endpoint in RETRIEVAL_ENDPOINTS:
        return sealed_call(request, body, endpoint, session.retrieval_model)
    return SealedCall(endpoint, body, _model_of(body), session.sealed_url_path(prefix, endpoint))


def _sealed_request(session: SealedSession, request: httpx2.Request, call: SealedCall, pin: object
                    ) -> tuple[Exchange, httpx2.Request]:
    exchange = session.seal(pin, call.endpoint, call.body, _api_key(request))  # type: ignore[arg-type]
    out = httpx2.Request("POST", request.url.copy_with(path=call.path, query=None),
                         headers=session.sealed_headers(exchange, request.headers),
                         content=exchange.sealed.wire, extensions=request.extensions)
    return exchange, out


def _plain_answer(session: SealedSession, request: httpx2.Request, response: httpx2.Response, raw: bytes,
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


def _whole_answer(reader: AnswerReader, pending: list[bytes]) -> httpx2.Response:
    reader.finish()
    head = reader.head
    assert head is not None
    return httpx2.Response(head.status, headers={"content-type": head.content_type,
                                                 RECEIPT_HEADER: reader.receipt_header()},
                           content=b"".join(pending))


def _is_stream(reader: AnswerReader) -> bool:
    assert reader.head is not None
    return reader.head.content_type.startswith("text/event-stream")


def _stream_head(reader: AnswerReader) -> tuple[int, dict[str, str]]:
    assert reader.head is not None
    return reader.head.status, {"content-type": reader.head.content_type}


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
            return _json_answer(path, response)
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
            return _broker_answer(response)
        finally:
            response.close()

    def pin(self, model: str, auth: str | None = None) -> object:
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
        call = _call(self.session, request, body, prefix, endpoint)
        model = call.model
        for attempt in range(2):
            try:
                pin = self.pin(model, request.headers.get("authorization"))
            except (_GatewayRefused, NoAttestedWorker) as exc:
                return _unpinned(exc, request)
            exchange, out = _sealed_request(self.session, request, call, pin)
            response = self._inner.handle_request(out)
            if self.session.is_sealed(response.headers.get("content-type", "")) and response.status_code == 200:
                return self._open(response, exchange)
            raw = response.read()
            response.close()
            answer = _plain_answer(self.session, request, response, raw, model, attempt)
            if answer is not None:
                return answer
        raise ReattestRequired("the pinned worker is gone")  # pragma: no cover - loop always returns

    def _open(self, response: httpx2.Response, exchange: Exchange) -> httpx2.Response:
        reader = self.session.reader(exchange)
        chunks = iter(response.stream)  # type: ignore[arg-type]  # the transport's raw bytes
        pending: list[bytes] = []
        try:
            while reader.head is None:
                pending += reader.feed(next(chunks))
        except StopIteration:
            response.close()
            reader.finish()  # raises: truncated before the head
        if _is_stream(reader):
            status, headers = _stream_head(reader)
            return httpx2.Response(status, headers=headers, stream=_SyncBody(reader, pending, chunks, response))
        for data in chunks:
            pending += reader.feed(data)
        response.close()
        return _whole_answer(reader, pending)

    def close(self) -> None:
        self._inner.close()


class _SyncBody(httpx2.SyncByteStream):
    def __init__(self, reader: AnswerReader, pending: list[bytes], chunks: Iterator[bytes],
                 response: httpx2.Response) -> None:
        self._reader, self._pending, self._chunks, self._response = reader, pending, chunks, response

    def __iter__(self) -> Iterator[bytes]:
        held: list[bytes] = []
        for part in self._pending:
            yield from _release(part, held)
        for data in self._chunks:
            for part in self._reader.feed(data):
                yield from _release(part, held)
        self._reader.finish()  # raises on truncation: the caller never takes a cut answer as whole
        yield from held

    def close(self) -> None:
        self._response.close()


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
            return _json_answer(path, response)
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
            return _broker_answer(response)
        finally:
            await response.aclose()

    async def pin(self, model: str, auth: str | None = None) -> object:
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
        call = _call(self.session, request, body, prefix, endpoint)
        model = call.model
        for attempt in range(2):
            try:
                pin = await self.pin(model, request.headers.get("authorization"))
            except (_GatewayRefused, NoAttestedWorker) as exc:
                return _unpinned(exc, request)
            exchange, out = _sealed_request(self.session, request, call, pin)
            response = await self._inner.handle_async_request(out)
            if self.session.is_sealed(response.headers.get("content-type", "")) and response.status_code == 200:
                return await self._open(response, exchange)
            raw = await response.aread()
            await response.aclose()
            answer = _plain_answer(self.session, request, response, raw, model, attempt)
            if answer is not None:
                return answer
        raise ReattestRequired("the pinned worker is gone")  # pragma: no cover

    async def _open(self, response: httpx2.Response, exchange: Exchange) -> httpx2.Response:
        reader = self.session.reader(exchange)
        chunks = response.stream.__aiter__()  # type: ignore[union-attr]
        pending: list[bytes] = []
        try:
            while reader.head is None:
                pending += reader.feed(await anext(chunks))
        except StopAsyncIteration:
            await response.aclose()
            reader.finish()
        if _is_stream(reader):
            status, headers = _stream_head(reader)
            return httpx2.Response(status, headers=headers, stream=_AsyncBody(reader, pending, chunks, response))
        async for data in chunks:
            pending += reader.feed(data)
        await response.aclose()
        return _whole_answer(reader, pending)

    async def aclose(self) -> None:
        await self._inner.aclose()


class _AsyncBody(httpx2.AsyncByteStream):
    def __init__(self, reader: AnswerReader, pending: list[bytes], chunks: AsyncIterator[bytes],
                 response: httpx2.Response) -> None:
        self._reader, self._pending, self._chunks, self._response = reader, pending, chunks, response

    async def __aiter__(self) -> AsyncIterator[bytes]:
        held: list[bytes] = []
        for part in self._pending:
            for p in _release(part, held):
                yield p
        async for data in self._chunks:
            for part in self._reader.feed(data):
                for p in _release(part, held):
                    yield p
        self._reader.finish()
        for p in held:
            yield p

    async def aclose(self) -> None:
        await self._response.aclose()
