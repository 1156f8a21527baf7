"""Refusals whose number an attacker chooses, audited in aggregate and still every one counted.

The first refusal of each *kind* (a tuple the caller chooses: status, code, route, tenant, ...) in a
window (`window_s`, 60 s) is written in full by the caller's `first` callback; further refusals of
that kind in the window are only counted, and when the window closes (the next refusal after it,
a timer on the running event loop, or `flush()` when the component stops) `summarize(kind, count,
window_s)` writes one summary per kind that had more than its first. Kinds are bounded per window
(`max_kinds`): refusals of further kinds are counted in one `overflow(count, window_s)` summary.
A flood of any size therefore costs at most 2 x `max_kinds` + 1 writes per window, and an auditor
reconciles totals exactly: refusals = first entries + summary counts.

Used by the gateway (edge refusals, admission refusals) and the key broker (schema refusals).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Hashable

Kind = tuple[Hashable, ...]


class WindowedRefusals:
    def __init__(self, summarize: Callable[[Kind, int, float], None], overflow: Callable[[int, float], None], *,
                 window_s: float = 60.0, max_kinds: int = 256, clock: Callable[[], float] = time.monotonic) -> None:
        self.window_s, self.max_kinds = window_s, max_kinds
        self._summarize, self._overflow_writer, self._clock = summarize, overflow, clock
        self._lock = threading.RLock()
        self._counts: dict[Kind, int] = {}  # kind -> refusals counted after its first entry
        self._overflow = 0
        self._opened = 0.0
        self._timer: asyncio.TimerHandle | None = None

    def refused(self, kind: Kind, first: Callable[[], None]) -> bool:
        """Count one refusal of `kind`; calls `first()` (which writes the full entry) when it is the
        first of its kind in the window. Returns True when it was written in full. If `first` raises,
        the refusal is not counted and the exception propagates (the caller logs it)."""
        with self._lock:
            now = self._clock()
            if (self._counts or self._overflow) and now - self._opened >= self.window_s:
                self._flush_locked(now)
            if not self._counts and not self._overflow:
                self._opened = now
                self._arm_timer()
            if kind in self._counts:
                self._counts[kind] += 1
                return False
            if len(self._counts) >= self.max_kinds:
                self._overflow += 1
                return False
            first()
            self._counts[kind] = 0
            return True

    def pending(self) -> int:
        """Refusals counted in the open window but not yet written in a summary."""
        with self._lock:
            return sum(self._counts.values()) + self._overflow

    def flush(self) -> None:
        """Write the window's summaries (at its end, and when the component stops)."""
        with self._lock:
            self._flush_locked(self._clock())

    def _flush_locked(self, now: float) -> None:
        counts, overflow, window = self._counts, self._overflow, round(now - self._opened, 3)
        self._counts, self._overflow = {}, 0
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for kind, count in counts.items():
            if count:
                self._summarize(kind, count, window)
        if overflow:
            self._overflow_writer(overflow, window)

    def _arm_timer(self) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # off the loop (a worker thread, a test): the next refusal or flush() writes them
        self._timer = loop.call_later(self.window_s, self.flush)
