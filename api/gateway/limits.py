"""Rate limits, token budgets and queue counters, in-process or shared through Redis.

Buckets come from policy.limiter (the policy helper's limiter protocol); a Redis store makes every
gateway replica draw from the same buckets. Redis keeps its own clock (TIME) inside the script, so
replicas with different monotonic clocks still agree on refills.
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import Protocol

from policy.limiter import BucketSpec

_TAKE = """
local cap, rate, cost, mode = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4]
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
local v = redis.call('HMGET', KEYS[1], 'tokens', 'ts')
local tokens = tonumber(v[1]) or cap
local last = tonumber(v[2]) or now
tokens = math.min(cap, tokens + math.max(0, now - last) * rate)
local ok = 0
if mode == 'take' then
  if tokens >= cost then tokens = tokens - cost; ok = 1 end
elseif mode == 'give' then
  tokens = math.min(cap, tokens + cost); ok = 1
end
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'ts', tostring(now))
redis.call('EXPIRE', KEYS[1], math.ceil(cap / math.max(rate, 1e-9)) + 60)
return {ok, tostring(tokens)}
"""


class RedisLimiterStore:
    """policy.limiter.LimiterStore over Redis: one atomic script per operation."""

    def __init__(self, client, prefix: str = "sealed:rl:") -> None:  # type: ignore[no-untyped-def]
        self._redis = client
        self._prefix = prefix
        self._script = client.register_script(_TAKE)

    def _run(self, key: str, spec: BucketSpec, cost: float, mode: str) -> tuple[bool, float]:
        ok, tokens = self._script(keys=[self._prefix + key], args=[spec.capacity, spec.rate, cost, mode])
        return bool(int(ok)), float(tokens)

    def take(self, key: str, cost: float, spec: BucketSpec, now: float) -> tuple[bool, float]:
        return self._run(key, spec, cost, "take")

    def peek(self, key: str, spec: BucketSpec, now: float) -> float:
        return self._run(key, spec, 0.0, "peek")[1]

    def give_back(self, key: str, amount: float, spec: BucketSpec, now: float) -> None:
        self._run(key, spec, amount, "give")


class QueueCounter(Protocol):
    """Requests queued or running per tenant, across every gateway replica that shares the store."""

    def enter(self, tenant: str, limit: int) -> bool: ...
    def leave(self, tenant: str) -> None: ...
    def full(self, tenant: str, limit: int) -> bool: ...  # enter() would refuse now (takes nothing)


class LocalQueueCounter:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Counter[str] = Counter()

    def enter(self, tenant: str, limit: int) -> bool:
        with self._lock:
            if self._counts[tenant] >= limit:
                return False
            self._counts[tenant] += 1
            return True

    def full(self, tenant: str, limit: int) -> bool:
        with self._lock:
            return self._counts.get(tenant, 0) >= limit

    def leave(self, tenant: str) -> None:
        with self._lock:
            self._counts[tenant] = max(0, self._counts[tenant] - 1)


_ENTER = """
local n = redis.call('INCR', KEYS[1])
redis.call('EXPIRE', KEYS[1], 3600)
if n > tonumber(ARGV[1]) then redis.call('DECR', KEYS[1]); return 0 end
return 1
"""


class RedisQueueCounter:
    def __init__(self, client, prefix: str = "sealed:q:") -> None:  # type: ignore[no-untyped-def]
        self._redis = client
        self._prefix = prefix
        self._enter = client.register_script(_ENTER)

    def enter(self, tenant: str, limit: int) -> bool:
        return bool(int(self._enter(keys=[self._prefix + tenant], args=[limit])))

    def leave(self, tenant: str) -> None:
        self._redis.decr(self._prefix + tenant)

    def full(self, tenant: str, limit: int) -> bool:
        return int(self._redis.get(self._prefix + tenant) or 0) >= limit
