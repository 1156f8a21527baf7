"""The gateway's edge, below routing: a body-size limit that holds for chunked bodies too, and JSON
text that cannot be encoded (a lone UTF-16 surrogate such as "\\ud800") refused with 400.

Both run before any route: a request body is read at most `max_body_bytes` far, whether or not it
declares a Content-Length (the cap is protocol.body_limit's, the key broker's too; a JSON body is
read whole, bounded, here), and a JSON body is checked once here instead of in every schema.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.gateway.errors import audit_edge, error_body
from policy.audit.edge import EdgeRefusals
from protocol.body_limit import BodyLimit, declared_too_large

_JSON_TYPES = ("application/json", "application/merge-patch+json")


def lone_surrogate(doc: Any) -> bool:
    """True if any string (or key) in a parsed JSON document is not encodable as UTF-8."""
    stack = [doc]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return True
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


async def _reply(edge: EdgeRefusals, scope: Scope, send: Send, status: int, message: str, code: str) -> None:
    audit_edge(edge, scope, status, "body_too_large" if status == 413 else code)
    body = json.dumps(error_body(message, "invalid_request_error", code)).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})


class EdgeGuard:
    def __init__(self, app: ASGIApp, max_body_bytes: int, edge: EdgeRefusals) -> None:
        self.app, self.max_body_bytes, self.edge = app, max_body_bytes, edge
        self.limited = BodyLimit(app, max_body_bytes, self._too_large)

    async def _too_large(self, scope: Scope, send: Send) -> None:
        await _reply(self.edge, scope, send, 413, "request body too large", "request_too_large")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if declared_too_large(scope, self.max_body_bytes):
            await self._too_large(scope, send)
            return
        headers = dict(scope.get("headers") or ())
        content_type = headers.get(b"content-type", b"").decode("latin-1").split(";")[0].strip().lower()
        if content_type in _JSON_TYPES or (content_type == "" and scope.get("method") in ("POST", "PUT", "PATCH")):
            await self._json(scope, receive, send)
            return
        await self.limited(scope, receive, send)

    async def _json(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Read the whole (bounded) body, check it, then hand it to the app in one piece."""
        parts, seen, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            seen += len(chunk)
            if seen > self.max_body_bytes:
                await self._too_large(scope, send)
                return
            parts.append(chunk)
            more = message.get("more_body", False)
        body = b"".join(parts)
        if b"\\u" in body or b"\\U" in body:
            try:
                doc = json.loads(body)
            except (ValueError, RecursionError):
                doc = None  # the route answers malformed JSON itself
            if lone_surrogate(doc):
                await _reply(self.edge, scope, send, 400, "the request contains text that is not valid Unicode "
                             "(a lone UTF-16 surrogate)", "invalid_value")
                return
        delivered = False

        async def replay() -> Message:
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # after the body: wait for the client to disconnect

        await self.app(scope, replay, send)
