"""Replay refusal for sealed requests: a time window plus the set of encapsulated keys seen in it."""

from __future__ import annotations

import threading
from collections import OrderedDict

from protocol.sealed.errors import RequestReplayed


class ReplayGuard:
    """Each request's encapsulated key (32 fresh random bytes per request) may be opened once.

    Keys are remembered for twice the window, so a request inside the window is never forgotten
    while it could still be accepted. A full guard refuses new requests rather than forgetting.
    """

    def __init__(self, window_s: float = 300.0, max_entries: int = 1_000_000) -> None:
        self.window_s, self.max_entries = window_s, max_entries
        self._seen: OrderedDict[bytes, float] = OrderedDict()
        self._lock = threading.Lock()

    def check(self, enc: bytes, sent_at_s: float, now_s: float) -> None:
        if abs(now_s - sent_at_s) > self.window_s:
            raise RequestReplayed("sealed request is outside the replay window (check the client clock)")
        with self._lock:
            horizon = now_s - 2 * self.window_s
            while self._seen and next(iter(self._seen.values())) < horizon:
                self._seen.popitem(last=False)
            if enc in self._seen:
                raise RequestReplayed("sealed request was already received")
            if len(self._seen) >= self.max_entries:
                raise RequestReplayed("replay cache full; retry shortly")
            self._seen[enc] = now_s
