"""Calls on stored state through SealedOpenAI (a stored response read back, a sealed-mode
conversation): the routing lookup they need first and the body they are sealed as. Sans-IO: the
transports (transport.py) do the requests."""

from __future__ import annotations

import json

import httpx2

from protocol.sealed import ReattestRequired
from protocol.sealed.http import CONVERSATIONS, SEALED_PREFIX, STORED_READ
from sealed_client.conversation_state import call_body, conversation_op, model_in
from sealed_client.stored_state import read_body, stored_id


def _route_get(request: httpx2.Request, path: str) -> httpx2.Request:
    headers = {k: v for k, v in request.headers.items() if k.lower() in ("authorization", "user-agent")}
    return httpx2.Request("GET", request.url.copy_with(path=path, query=None), headers=headers)


def routing_lookup(request: httpx2.Request, prefix: str, endpoint: str) -> httpx2.Request | None:
    """The gateway's routing data a call on stored state needs first (which model's worker to pin: the
    request names none), or None. A gateway that names another model gets a worker that cannot open it."""
    if endpoint == STORED_READ:
        return _route_get(request, f"{prefix}{SEALED_PREFIX}/responses/{stored_id(request.url.path)[0]}/route")
    if endpoint == CONVERSATIONS:
        op = conversation_op(request.method, request.url.path.rstrip("/"))
        if op is not None and op[1] is not None:
            return _route_get(request, f"{prefix}{SEALED_PREFIX}/conversations/{op[1]}/route")
    return None


def routed_model(request: httpx2.Request, route: httpx2.Response, raw: bytes) -> str | httpx2.Response:
    """The model the gateway routes the stored state to, or its refusal (404 for an unknown id) as is."""
    if route.status_code != 200:
        return httpx2.Response(route.status_code, headers=route.headers, content=raw, request=request)
    try:
        model = json.loads(raw)["model"]
    except (ValueError, KeyError, TypeError) as exc:
        raise ReattestRequired("the gateway's routing answer for stored state names no model") from exc
    if not isinstance(model, str) or not model:
        raise ReattestRequired("the gateway's routing answer for stored state names no model")
    return model


def body_to_seal(request: httpx2.Request, endpoint: str, raw: bytes, model: str | None) -> bytes | httpx2.Response:
    """The body to seal: the request's own, or for a call on stored state its path, query and body."""
    path, query = request.url.path.rstrip("/"), request.url.params.multi_items()
    if endpoint == STORED_READ:
        assert model is not None
        return read_body(path, query, model)
    if endpoint != CONVERSATIONS:
        return raw
    op = conversation_op(request.method, path)
    assert op is not None
    model = model or model_in(raw)
    if model is None:
        return httpx2.Response(400, request=request, json={"error": {
            "message": "in sealed mode a new conversation is sealed under a model's key: name the model "
                       "(extra_body={'model': ...})", "type": "invalid_request_error", "param": "model",
            "code": "invalid_value"}})
    return call_body(*op, query, raw, model)
