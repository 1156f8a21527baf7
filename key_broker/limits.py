"""Request limits: per-identity rate limits, and the answer to a body over the size cap.

Rate limits use the policy package's token buckets: challenges and attestations per client
address (all a broker knows before evidence verifies), key releases and status checks per
attested worker identity (its measurement, plus the chip id where the TEE reports one).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from starlette.types import Scope, Send

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


async def reject_too_large(scope: Scope, send: Send) -> None:
    """The broker's 413 (the cap itself is protocol.body_limit.BodyLimit, the gateway's too)."""
    edge = getattr(getattr(getattr(scope.get("app"), "state", None), "service", None), "edge", None)
    if edge is not None:  # audited in aggregate (policy/audit/edge.py)
        edge.refused(scope, 413, "body_too_large")
    await send({"type": "http.response.start", "status": 413,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(_TOO_LARGE)).encode())]})
    await send({"type": "http.response.body", "body": _TOO_LARGE})
