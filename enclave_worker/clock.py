"""The worker's clock: wall time for the records it signs, monotonic time for how long it worked.

One object on `WorkerState`, so tests give the worker a fixed clock instead of asserting durations.
"""

from __future__ import annotations

import time
from dataclasses import dataclass


@dataclass(frozen=True)
class Clock:
    def now(self) -> float:
        """Seconds since the epoch (the `at` of a usage record, a decision, a receipt)."""
        return time.time()

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back (a request's `worker_seconds`)."""
        return time.monotonic()
