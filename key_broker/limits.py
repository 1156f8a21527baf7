"""Request limits: per-identity rate limits and a hard cap on body size.

Rate limits use the policy package's token buckets: challenges and attestations per client
address (all a broker knows before evidence verifies), key releases and status checks per
attested worker identity (its measurement, plus the chip id where the TEE reports one).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from key_broker.errors import RateLimited
from policy.limiter import BucketSpec, TokenBucketLimiter


@dataclass(frozen=True)
class RateLimits:
    per_minute: int = 600  # per identity and action; bursts up to a minute's allowance

    def spec(self) -> BucketSpec:
        return TokenBucketLimiter.per_minute(self.per_minute)


class BrokerLimiter:
    def __init__(self, limits: RateLimits) -> None:
        self._limiter = TokenBucketLimiter()
        self._spec = limits.spec()

    def check(self, action: str, identity: str) -> None:
        if not self._limiter.try_acquire(f"{action}|{identity}", self._spec):
            raise RateLimited(f"{action} rate limit exceeded")


_TOO_LARGE = json.dumps({"error": {"type": "invalid_request", "message": "body too large"}}).encode()


class BodyLimitMiddleware:
    """Pure ASGI: refuses a declared Content-Length over the cap at once, and counts the bytes of
    chunked bodies as they arrive, so no body larger than the cap is ever buffered."""

    def __init__(self, app, max_bytes: int) -> None:  # type: ignore[no-untyped-def]
        self.app = app
        self.max_bytes = max_bytes

    async def _reject(self, scope, send) -> None:  # type: ignore[no-untyped-def]
        edge = getattr(getattr(getattr(scope.get("app"), "state", None), "service", None), "edge", None)
        if edge is not None:  # audited in aggregate (key_broker/edge_audit.py)
            edge.refused(scope, 413, "body_too_large")
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(_TOO_LARGE)).encode())]})
        await send({"type": "http.response.body", "body": _TOO_LARGE})

    async def __call__(self, scope, receive, send) -> None:  # type: ignore[no-untyped-def]
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        length = headers.get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_bytes):
            await self._reject(scope, send)
            return
        seen = 0
        started = False

        async def counting_receive():  # type: ignore[no-untyped-def]
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise _BodyTooLarge
            return message

        async def tracking_send(message):  # type: ignore[no-untyped-def]
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, counting_receive, tracking_send)
        except _BodyTooLarge:
            if not started:
                await self._reject(scope, send)


class _BodyTooLarge(BaseException):
    """BaseException on purpose: FastAPI turns any Exception raised while reading a body into a
    generic 400, and this must reach the middleware to become a 413."""
