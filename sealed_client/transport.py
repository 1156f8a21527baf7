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

Both transports drive one sans-IO flow (sealed_client/flow.py: routing, pinning, sealing, the one
retry, opening), one blocking and one awaited (sealed_client/steps.py); they add only the inner
transport that does the I/O.
"""

from __future__ import annotations

import httpx2

from sealed_client.deployment import PinnedKey
from sealed_client.flow import RequestFlow
from sealed_client.routing import warn_plaintext
from sealed_client.session import SealedSession
from sealed_client.steps import drive, drive_async


class SealedTransport(httpx2.BaseTransport):
    def __init__(self, session: SealedSession, gateway_url: str, inner: httpx2.BaseTransport | None = None, *,
                 unsafe_allow_plaintext: bool = False) -> None:
        self.session, self.gateway_url = session, gateway_url.rstrip("/")
        self._inner = inner or httpx2.HTTPTransport()
        self.unsafe_allow_plaintext = warn_plaintext(unsafe_allow_plaintext)

    def _flow(self) -> RequestFlow:
        return RequestFlow(self.session, self.gateway_url, self.unsafe_allow_plaintext)

    def pin(self, model: str, auth: str | None = None) -> PinnedKey:
        """The verified worker for `model` (RequestFlow.pin)."""
        return drive(self._flow().pin(model, auth), self._inner.handle_request)

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        return drive(self._flow().handle(request), self._inner.handle_request)

    def close(self) -> None:
        self._inner.close()


class AsyncSealedTransport(httpx2.AsyncBaseTransport):
    def __init__(self, session: SealedSession, gateway_url: str,
                 inner: httpx2.AsyncBaseTransport | None = None, *, unsafe_allow_plaintext: bool = False) -> None:
        self.session, self.gateway_url = session, gateway_url.rstrip("/")
        self._inner = inner or httpx2.AsyncHTTPTransport()
        self.unsafe_allow_plaintext = warn_plaintext(unsafe_allow_plaintext)

    def _flow(self) -> RequestFlow:
        return RequestFlow(self.session, self.gateway_url, self.unsafe_allow_plaintext)

    async def pin(self, model: str, auth: str | None = None) -> PinnedKey:
        """The verified worker for `model` (RequestFlow.pin)."""
        return await drive_async(self._flow().pin(model, auth), self._inner.handle_async_request)

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        return await drive_async(self._flow().handle(request), self._inner.handle_async_request)

    async def aclose(self) -> None:
        await self._inner.aclose()
