"""Token-bucket rate limiting for admission, with a pluggable store.

The gateway keeps one bucket per (API key, limit). ``InMemoryLimiterStore`` serves one process;
a shared store (e.g. Redis, one atomic script per take) implements the same ``LimiterStore``
protocol so several gateway replicas share limits.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class BucketSpec:
    """``capacity`` tokens, refilled continuously at ``rate`` tokens per second."""

    capacity: float
    rate: float


class LimiterStore(Protocol):
    """Atomic bucket state. ``take`` must check and deduct in one step (no read-then-write race)."""

    def take(self, key: str, cost: float, spec: BucketSpec, now: float) -> tuple[bool, float]:
        """Deduct ``cost`` if available; returns (taken, tokens left after the call)."""
        ...

    def peek(self, key: str, spec: BucketSpec, now: float) -> float:
        """Tokens available now, without deducting."""
        ...

    def give_back(self, key: str, amount: float, spec: BucketSpec, now: float) -> None:
        """Return unused tokens (e.g. a reservation larger than what was used), capped at capacity."""
        ...


class InMemoryLimiterStore:
    """Process-local store: a dict of (tokens, last refill time) under one lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._buckets: dict[str, tuple[float, float]] = {}

    def _refilled(self, key: str, spec: BucketSpec, now: float) -> float:
        tokens, last = self._buckets.get(key, (spec.capacity, now))
        return min(spec.capacity, tokens + max(0.0, now - last) * spec.rate)

    def take(self, key: str, cost: float, spec: BucketSpec, now: float) -> tuple[bool, float]:
        with self._lock:
            tokens = self._refilled(key, spec, now)
            if tokens >= cost:
                tokens -= cost
                self._buckets[key] = (tokens, now)
                return True, tokens
            self._buckets[key] = (tokens, now)
            return False, tokens

    def peek(self, key: str, spec: BucketSpec, now: float) -> float:
        with self._lock:
            return self._refilled(key, spec, now)

    def give_back(self, key: str, amount: float, spec: BucketSpec, now: float) -> None:
        with self._lock:
            self._buckets[key] = (min(spec.capacity, self._refilled(key, spec, now) + amount), now)


class TokenBucketLimiter:
    """Rate and budget buckets for API keys, over any ``LimiterStore``."""

    def __init__(self, store: LimiterStore | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.store: LimiterStore = store if store is not None else InMemoryLimiterStore()
        self._clock = clock

    @staticmethod
    def per_minute(requests: int) -> BucketSpec:
        # Burst up to a full minute's allowance, refilled smoothly.
        return BucketSpec(float(requests), requests / 60.0)

    @staticmethod
    def per_day(tokens: int) -> BucketSpec:
        return BucketSpec(float(tokens), tokens / 86400.0)

    def try_acquire(self, key: str, spec: BucketSpec, cost: float = 1.0) -> bool:
        return self.store.take(key, cost, spec, self._clock())[0]

    def available(self, key: str, spec: BucketSpec) -> float:
        return self.store.peek(key, spec, self._clock())

    def refund(self, key: str, spec: BucketSpec, amount: float) -> None:
        if amount > 0:
            self.store.give_back(key, amount, spec, self._clock())
