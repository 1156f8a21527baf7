"""Worker liveness judged on the gateway's own clock: a busy gateway never declares a worker dead.

A heartbeat that arrives late because the gateway's event loop was saturated (relaying thousands
of stream chunks a second, say) says nothing about the worker. So the registry measures heartbeat
age on a `LoopClock`: time that advances only as fast as the event loop keeps up. A ticker wakes
every `tick_s`; each turn adds at most `tick_s` to the clock however late it woke, so while the
loop lags, the clock slows down with it, and a worker is out of rotation only after missing its
heartbeats for `heartbeat_timeout_s` of time the gateway itself was responsive. Off the loop (or
before the ticker starts), it is plain monotonic time.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable


class LoopClock:
    def __init__(self, tick_s: float = 0.1) -> None:
        self.tick_s = tick_s
        self._stalled = 0.0  # seconds of loop lag subtracted from monotonic time
        self._last_tick: float | None = None  # monotonic time of the ticker's last turn
        self._task: asyncio.Task[None] | None = None
        self._observers: list[Callable[[float], None]] = []  # called each turn with that turn's lag (s)

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    @property
    def stalled_s(self) -> float:
        """Total loop lag so far (seconds the clock did not advance)."""
        return self._stalled

    def now(self) -> float:
        real = time.monotonic()
        if self._last_tick is None or not self.running:
            return real - self._stalled
        # A turn that is late has not been counted yet: count at most one tick of it.
        return min(real, self._last_tick + self.tick_s) - self._stalled

    def on_tick(self, observer: Callable[[float], None]) -> None:
        """Call `observer(lag_s)` on every turn of the ticker (the adaptive dispatch capacity uses it)."""
        self._observers.append(observer)

    def start(self) -> None:
        """Start the ticker on the running loop (the gateway's lifespan); idempotent."""
        if not self.running:
            self._last_tick = time.monotonic()
            self._task = asyncio.get_running_loop().create_task(self._tick())

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is None:
            return
        task.cancel()
        if task.get_loop() is asyncio.get_running_loop():  # a ticker of another (finished) loop: cancelled only
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(self.tick_s)
            now = time.monotonic()
            last = self._last_tick if self._last_tick is not None else now
            lag = max(0.0, (now - last) - self.tick_s)
            self._stalled += lag
            self._last_tick = now
            for observer in self._observers:
                observer(lag)
