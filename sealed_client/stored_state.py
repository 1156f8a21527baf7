"""Stored responses through SealedOpenAI: what the client checks of the state an answer continued.

A /v1/responses request with `previous_response_id` names the id to the gateway in clear (the gateway
fetches the chain of ciphertext by it); the worker checks the chain against the id sealed inside the
request, and states in the answer's sealed head the ids it opened (covered by the receipt's response
hash). The client refuses an answer that does not state it continued exactly what it asked for, and
one that claims a history it did not ask for.
"""

from __future__ import annotations

import json
from typing import Any

from protocol.sealed.http import ResponseHead
from sealed_client.errors import HistoryMismatch

RESPONSES = "/v1/responses"


def previous_response_id(endpoint: str, body: bytes) -> str | None:
    """The `previous_response_id` of a /v1/responses body (None if absent, or the body is not an object:
    the worker refuses such a request by itself)."""
    if endpoint != RESPONSES:
        return None
    try:
        doc: Any = json.loads(body)
    except (ValueError, RecursionError):
        return None
    previous = doc.get("previous_response_id") if isinstance(doc, dict) else None
    return previous if isinstance(previous, str) else None


def check_history(head: ResponseHead, previous: str | None) -> None:
    """The answer continued the stored response the request named, and nothing else."""
    if head.status != 200:
        return  # a refusal continued nothing
    if previous is None:
        if head.history:
            raise HistoryMismatch("the answer continued stored responses this request did not name")
        return
    if not head.history or head.history[-1] != previous:
        raise HistoryMismatch(f"the answer does not state it continued previous_response_id {previous[:64]!r}")
