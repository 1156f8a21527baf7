"""Stored responses through SealedOpenAI: what the client checks of the state an answer continued.

A /v1/responses request with `previous_response_id` names the id to the gateway in clear (the gateway
fetches the chain of ciphertext by it); the worker checks the chain against the id sealed inside the
request, and states in the answer's sealed head the ids it opened (covered by the receipt's response
hash). The client refuses an answer that does not state it continued exactly what it asked for, and
one that claims a history it did not ask for.

Reading one back (`responses.retrieve`, `responses.input_items.list`): the GET's path and query are
sealed as a body to STORED_READ (protocol/openai/stored_read.py), to a worker of the model the gateway
names for the id (a gateway naming another model gets a worker that cannot open the state); the
answer must state it opened exactly that id.
"""

from __future__ import annotations

import json
import re
from typing import Any

from protocol.sealed.http import STORED_READ, ResponseHead
from sealed_client.errors import HistoryMismatch

RESPONSES = "/v1/responses"
STORED_RESPONSE = re.compile(r"/v1/responses/(?P<id>[^/]+)(?P<items>/input_items)?$")  # GET, DELETE of one


def json_object(body: bytes) -> dict[str, Any] | None:
    """A request body as a JSON object, or None when it is not one (the worker refuses such a request
    by itself; the client only reads the ids it must check)."""
    try:
        doc: Any = json.loads(body)
    except (ValueError, RecursionError):
        return None
    return doc if isinstance(doc, dict) else None


def previous_response_id(endpoint: str, body: bytes) -> str | None:
    """The `previous_response_id` of a /v1/responses body (None if absent, or the body is not an object)."""
    doc = json_object(body) if endpoint in (RESPONSES, STORED_READ) else None
    if doc is None:
        return None
    previous = doc.get("previous_response_id" if endpoint == RESPONSES else "response_id")
    return previous if isinstance(previous, str) else None


def stored_id(path: str) -> tuple[str, str]:
    """(response id, part) of a GET routed to STORED_READ (routing.py matched the path)."""
    found = STORED_RESPONSE.search(path.rstrip("/"))
    if found is None:
        raise ValueError("not a stored response's path")
    return found.group("id"), "input_items" if found.group("items") else "response"


def read_body(path: str, query: list[tuple[str, str]], model: str) -> bytes:
    """The sealed body of a stored-response GET: its id, the part asked for and its query parameters
    (a value that is not what the read takes is sent as it is: the worker refuses it by name)."""
    response_id, part = stored_id(path)
    doc: dict[str, Any] = {"model": model, "response_id": response_id, "part": part}
    for name, value in query:
        if name == "include[]" or name == "include":
            doc.setdefault("include", []).append(value)
        elif name == "limit":
            doc[name] = int(value) if value.isdigit() else value
        elif name == "stream":
            doc[name] = {"true": True, "false": False}.get(value, value)
        else:
            doc[name] = value
    return json.dumps(doc).encode()


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
