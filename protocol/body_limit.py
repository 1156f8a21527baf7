"""A hard cap on request bodies, as pure ASGI middleware, for every role's HTTP service.

A declared Content-Length over the cap is refused at once; chunked bodies are counted as they
arrive, so no body larger than the cap is ever buffered. How a refusal is answered (and audited)
is the service's own: `reject(scope, send)` writes the 413.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

Reject = Callable[[Scope, Send], Awaitable[None]]


def declared_too_large(scope: Scope, max_bytes: int) -> bool:
    """A Content-Length over the cap, or one that is not a number."""
    length = dict(scope.get("headers") or ()).get(b"content-length")
    return length is not None and (not length.isdigit() or int(length) > max_bytes)


class BodyTooLarge(BaseException):
    """BaseException on purpose: FastAPI turns any Exception raised while reading a body into a
    generic 400, and this must reach the middleware to become a 413."""


class BodyLimit:
    def __init__(self, app: ASGIApp, max_bytes: int, reject: Reject) -> None:
        self.app, self.max_bytes, self.reject = app, max_bytes, reject

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if declared_too_large(scope, self.max_bytes):
            await self.reject(scope, send)
            return
        seen = 0
        started = False

        async def bounded() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise BodyTooLarge
            return message

        async def tracking(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, bounded, tracking)
        except BodyTooLarge:
            if not started:
                await self.reject(scope, send)
