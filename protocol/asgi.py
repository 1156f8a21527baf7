"""What every role's process shares: FastAPI options and how its cyclic garbage collector runs."""

from __future__ import annotations

import gc
import inspect
import logging
import threading
import time
from typing import Any

log = logging.getLogger(__name__)


def without_native_telemetry() -> dict[str, Any]:
    """FastAPI's keyword arguments that turn its native OpenTelemetry off, where it has any.

    We export Prometheus metrics, and traces only through our own spans (protocol/tracing: off unless
    OTEL_* asks, and then only allow-listed attributes, never a request's body or headers); FastAPI's
    per-request check for a configured provider (environment lookups) was 3% of the gateway's event
    loop under a flood.
    FastAPI grew the option in a 0.16x release; the vLLM worker's virtualenv pins an older FastAPI
    (0.136), which has no such check and no such argument.
    """
    from fastapi import FastAPI

    if "telemetry" not in inspect.signature(FastAPI.__init__).parameters:
        return {}
    return {"telemetry": {"tracing": False, "metrics": False, "logs": False}}


def freeze_startup_heap() -> None:
    """Take everything alive at start-up (imported modules, settings, the app) out of the cyclic
    collector's view (`gc.freeze`), so that a full collection scans only what serving creates.

    A role process imports FastAPI, pydantic, gRPC, protobuf and SQLAlchemy (the worker torch too):
    hundreds of thousands of objects that live as long as the process. Each generation-2 collection
    walked all of them, and under `sealed bench flood` those walks paused the gateway's event loop for
    80-460 ms at a time (measured with gc.callbacks), which is what a quiet tenant's p99 time to first
    token saw. Called before any key or prompt exists in the process: frozen objects are still freed by
    reference counting; only cyclic garbage among them would wait for the process to end.
    """
    gc.collect()
    gc.freeze()


class FullCollections:
    """Generation-2 collections on a timer instead of CPython's own trigger (`schedule_full_collections`)."""

    # CPython 3.11 runs a full collection once `threshold2` gen-1 collections have passed and the
    # objects promoted since the last one exceed a quarter of the long-lived ones. Under load nearly
    # every request's objects outlive a gen-1 pass, so that trigger fires every few seconds.
    NEVER = 1 << 30

    def __init__(self, interval_s: float) -> None:
        if not interval_s > 0:
            raise ValueError("the full-collection interval must be positive")
        self.interval_s = interval_s
        self.collections = 0
        self._saved = gc.get_threshold()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="full-gc", daemon=True)

    def start(self) -> FullCollections:
        g0, g1, _ = self._saved
        gc.set_threshold(g0, g1, self.NEVER)  # young generations collect as before
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        gc.set_threshold(*self._saved)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            started = time.perf_counter()
            found = gc.collect(2)
            self.collections += 1
            log.debug("scheduled full collection: %d objects in %.1f ms", found,
                      1000 * (time.perf_counter() - started))


def schedule_full_collections(interval_s: float = 60.0) -> FullCollections:
    """Run full (generation-2) collections every `interval_s` seconds, and never on CPython's trigger.

    After `freeze_startup_heap`, a full collection still walks every object that serving keeps alive:
    under `sealed bench flood` (500 open streams) the gateway's heap held ~150,000 of them, and
    CPython's own trigger ran a full pass every ~5 s, each pausing the event loop for 50-400 ms
    (gc.callbacks), lining up with the quiet tenant's slowest times to first token. They found almost
    nothing to free (20-2,800 objects a pass): cycles die young and generations 0 and 1, which still
    collect on their thresholds, take them. So a full pass runs on a timer, here on its own thread,
    which bounds the cyclic garbage that reaches generation 2 to what one interval makes, and the
    pauses to one an interval.
    """
    return FullCollections(interval_s).start()
