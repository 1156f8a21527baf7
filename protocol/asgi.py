"""What every role's FastAPI app shares."""

from __future__ import annotations

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
