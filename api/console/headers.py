"""The security headers on every /console response."""

from __future__ import annotations

import time
from typing import Any

_HEADERS = [
    # No inline script or style, nothing from elsewhere, never framed, never cached.
    (b"content-security-policy", b"default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; "
                                 b"frame-ancestors 'none'; base-uri 'none'"),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    # same-origin, not no-referrer: with no-referrer Chromium sends "Origin: null" on form posts.
    (b"referrer-policy", b"same-origin"),
    (b"cache-control", b"no-store"),
]


class ConsoleHeaders:
    """Security headers on /console responses; a plain ASGI layer, so the API's streams pass untouched."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or not scope["path"].startswith("/console"):
            await self.app(scope, receive, send)
            return
        scope.setdefault("state", {})["console_started"] = time.perf_counter()

        async def with_headers(message: Any) -> None:
            if message["type"] == "http.response.start":
                names = {name for name, _ in _HEADERS}
                message["headers"] = [h for h in message.get("headers", []) if h[0] not in names] + _HEADERS
            await send(message)
        await self.app(scope, receive, with_headers)
