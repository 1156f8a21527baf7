"""What every role's FastAPI app shares."""

from __future__ import annotations

import gc
import inspect
from typing import Any


def without_native_telemetry() -> dict[str, Any]:
    """FastAPI's keyword arguments that turn its native OpenTelemetry off, where it has any.

    We export Prometheus metrics, not OpenTelemetry, and FastAPI's per-request check for a
    configured provider (environment lookups) was 3% of the gateway's event loop under a flood.
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
