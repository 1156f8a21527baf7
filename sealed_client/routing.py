"""Which requests the client seals, passes through, or refuses (fail closed)."""

from __future__ import annotations

import logging
import re

import httpx2

from sealed_client.errors import UnsealedRequest
from sealed_client.session import endpoint_of

log = logging.getLogger(__name__)

_CONTENT_FREE = ("/v1/models",)  # GET only: answers list models, the request carries nothing
_STORED_RESPONSE = re.compile(r"/v1/responses/[^/]+(/input_items)?$")


def warn_plaintext(unsafe_allow_plaintext: bool) -> bool:
    if unsafe_allow_plaintext:
        log.warning("UNSAFE: requests the client cannot seal are sent in PLAINTEXT (unsafe_allow_plaintext)")
    return unsafe_allow_plaintext


def route_of(request: httpx2.Request, unsafe_allow_plaintext: bool) -> tuple[str, str] | None:
    """(prefix, endpoint) of a request to seal; None for one to pass through unchanged; raises
    UnsealedRequest for anything else (fail closed)."""
    route = endpoint_of(request.url.path)
    if route is not None and request.method == "POST":
        return route
    path = request.url.path.rstrip("/")
    if request.method in ("GET", "HEAD") and any(path.endswith(p) or f"{p}/" in path for p in _CONTENT_FREE):
        return None
    stored = _STORED_RESPONSE.search(path)
    if stored is not None and request.method == "DELETE" and stored.group(1) is None:
        return None  # the request names an id, the answer says it is deleted: nothing to seal either way
    if stored is not None and not unsafe_allow_plaintext:
        raise UnsealedRequest(f"{request.method} {request.url.path}: a stored response is continued sealed "
                              "(previous_response_id), deleted, but not read back through SealedOpenAI "
                              "(docs/sealed-mode.md); refused before sending")
    if unsafe_allow_plaintext:
        return None
    raise UnsealedRequest(f"{request.method} {request.url.path} cannot be sealed (sealed endpoints: POST "
                          "…/v1/chat/completions, …/v1/completions, …/v1/responses and …/v1/embeddings; is the "
                          "base URL missing /v1?); refused before sending")
