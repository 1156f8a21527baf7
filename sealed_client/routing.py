"""Which requests the client seals, passes through, or refuses (fail closed)."""

from __future__ import annotations

import logging

import httpx2

from protocol.sealed.http import CONVERSATIONS, STORED_READ
from sealed_client.conversation_state import CONVERSATION_PATH, conversation_op
from sealed_client.errors import UnsealedRequest
from sealed_client.retrieval import retrieval_route
from sealed_client.session import endpoint_of
from sealed_client.stored_state import STORED_RESPONSE as _STORED_RESPONSE

log = logging.getLogger(__name__)

_CONTENT_FREE = ("/v1/models",)  # GET only: answers list models, the request carries nothing


def warn_plaintext(unsafe_allow_plaintext: bool) -> bool:
    if unsafe_allow_plaintext:
        log.warning("UNSAFE: requests the client cannot seal are sent in PLAINTEXT (unsafe_allow_plaintext)")
    return unsafe_allow_plaintext


def route_of(request: httpx2.Request, unsafe_allow_plaintext: bool) -> tuple[str, str] | None:
    """(prefix, endpoint) of a request to seal; None for one to pass through unchanged; raises
    UnsealedRequest for anything else (fail closed)."""
    conversation = CONVERSATION_PATH.search(request.url.path.rstrip("/"))
    if conversation is not None:  # sealed, but deleting a whole conversation (conversation_state.py)
        if conversation_op(request.method, request.url.path.rstrip("/")) is None:
            return None
        return request.url.path[: conversation.start()], CONVERSATIONS
    route = endpoint_of(request.url.path)
    if route is not None and request.method == "POST":
        return route
    retrieval = retrieval_route(request)  # files and vector stores (sealed_client/retrieval.py)
    if retrieval:
        return "", retrieval
    if retrieval == "":
        return None  # ids, names, metadata, attributes, status: in clear at the gateway anyway
    path = request.url.path.rstrip("/")
    if request.method in ("GET", "HEAD") and any(path.endswith(p) or f"{p}/" in path for p in _CONTENT_FREE):
        return None
    stored = _STORED_RESPONSE.search(path)
    if stored is not None and request.method == "DELETE" and stored.group("items") is None:
        return None  # the request names an id, the answer says it is deleted: nothing to seal either way
    if stored is not None and request.method == "GET":
        return path[: stored.start()], STORED_READ  # read back sealed: the worker opens it (stored_state.py)
    if stored is not None and not unsafe_allow_plaintext:
        raise UnsealedRequest(f"{request.method} {request.url.path}: a stored response is continued sealed "
                              "(previous_response_id), read back (GET) and deleted through SealedOpenAI, "
                              "nothing else (docs/sealed-mode.md); refused before sending")
    if unsafe_allow_plaintext:
        return None
    raise UnsealedRequest(f"{request.method} {request.url.path} cannot be sealed (sealed endpoints: POST "
                          "…/v1/chat/completions, …/v1/completions, …/v1/responses, …/v1/embeddings, …/v1/files "
                          "and …/v1/vector_stores/{id}/search; is the base URL missing /v1?); refused before sending")
