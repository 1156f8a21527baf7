"""OpenTelemetry traces across gateway -> worker -> key broker, off unless the operator turns them on
(docs/tracing.md).

``tracing_from_env(service)`` gives ``NoTracing`` (no OpenTelemetry import, no per-request work) unless
the standard ``OTEL_*`` environment asks for traces; then ``OtelTracing`` (the OpenTelemetry SDK with its
OTLP exporter). Spans carry only allow-listed ids, sizes and counts (``attributes.py``); a value that is
not one of those is a ``TracingError``, so no prompt, completion or tool argument can reach a span.
"""

from protocol.tracing.attributes import TracingError
from protocol.tracing.config import tracing_from_env
from protocol.tracing.noop import NULL_SPAN, NoTracing, Span, Tracing
from protocol.tracing.settings import TracingSettings

__all__ = ["NULL_SPAN", "NoTracing", "Span", "Tracing", "TracingError", "TracingSettings", "tracing_from_env"]
