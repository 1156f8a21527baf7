"""This role's tracing: nothing at all unless the OTEL_* environment asks (settings.py)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from protocol.tracing.noop import NoTracing, Tracing
from protocol.tracing.settings import TracingSettings


def tracing_from_env(service: str, environ: Mapping[str, str] | None = None, *, exporter: Any = None) -> Tracing:
    """This role's tracing: ``NoTracing`` unless the environment asks for traces. ``exporter``: a span
    exporter to use instead of the configured one (tests hand in the SDK's in-memory exporter)."""
    settings = TracingSettings.from_env(environ)
    if not settings.enabled and exporter is None:
        return NoTracing()
    from protocol.tracing.otel import OtelTracing  # the SDK is imported only when tracing is on

    return OtelTracing(f"sealed-{service}", settings, exporter=exporter)
