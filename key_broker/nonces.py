"""Single-use, short-lived challenges. In memory: a restarted broker forgets open sessions, so an
in-flight attestation fails cleanly and the worker starts again with a new challenge."""

from __future__ import annotations

import datetime as dt
import secrets
import threading
from collections.abc import Callable
from dataclasses import dataclass

from key_broker.errors import ReleaseRefused

NONCE_BYTES = 32


@dataclass(frozen=True)
class Challenge:
    session_id: str
    nonce: bytes
    expires_at: dt.datetime


class ChallengeStore:
    def __init__(self, clock: Callable[[], dt.datetime], ttl: dt.timedelta, max_open: int = 10_000) -> None:
        self._clock = clock
        self._ttl = ttl
        self._max_open = max_open
        self._open: dict[str, Challenge] = {}
        self._lock = threading.Lock()

    def issue(self) -> Challenge:
        now = self._clock()
        challenge = Challenge(secrets.token_hex(16), secrets.token_bytes(NONCE_BYTES), now + self._ttl)
        with self._lock:
            self._expire(now)
            if len(self._open) >= self._max_open:
                raise ReleaseRefused("too many open challenges")
            self._open[challenge.session_id] = challenge
        return challenge

    def consume(self, session_id: str) -> Challenge:
        """Return the challenge and forget it: a second use of the same session is a replay."""
        now = self._clock()
        with self._lock:
            challenge = self._open.pop(session_id, None)
        if challenge is None:
            raise ReleaseRefused("unknown or already used challenge session")
        if now > challenge.expires_at:
            raise ReleaseRefused("challenge expired")
        return challenge

    def _expire(self, now: dt.datetime) -> None:
        for sid in [s for s, c in self._open.items() if now > c.expires_at]:
            del self._open[sid]
