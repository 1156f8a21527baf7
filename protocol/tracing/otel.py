"""Tracing with the OpenTelemetry SDK: a tracer provider of this process's own (the global one is
left alone), batch export over OTLP/HTTP, W3C trace context in and out. Imported only when on."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from protocol.tracing.attributes import Value, checked
from protocol.tracing.noop import Parent, Span
from protocol.tracing.settings import TracingSettings

log = logging.getLogger(__name__)
_KINDS = {"internal": SpanKind.INTERNAL, "server": SpanKind.SERVER, "client": SpanKind.CLIENT}
_CONTEXT_KEYS = frozenset({"traceparent", "tracestate"})


class _OtelSpan:
    def __init__(self, span: trace.Span) -> None:
        self.span = span

    def set(self, key: str, value: Value) -> None:
        self.span.set_attributes(checked({key: value}))

    def end(self, error: str = "") -> None:
        if error:
            self.span.set_status(Status(StatusCode.ERROR))
            self.span.set_attributes(checked({"sealed.error": error}))
        self.span.end()

    @property
    def context(self) -> Parent:
        return trace.set_span_in_context(self.span)


class OtelTracing:
    enabled = True

    def __init__(self, service: str, settings: TracingSettings, *, exporter: SpanExporter | None = None) -> None:
        if exporter is None:
            exporter = self._exporter(settings)
        # The sampler comes from OTEL_TRACES_SAMPLER(_ARG) (default: parent-based, always on).
        self._provider = TracerProvider(resource=Resource.create({"service.name": service}))
        self._provider.add_span_processor(BatchSpanProcessor(exporter))
        self._tracer = self._provider.get_tracer("sealed")
        self._propagator = TraceContextTextMapPropagator()
        self._epoch_offset_ns = time.time_ns() - time.monotonic_ns()
        log.info("tracing on: %s spans exported (%s)", service, settings.exporter)

    @staticmethod
    def _exporter(settings: TracingSettings) -> SpanExporter:
        if settings.exporter == "console":
            return ConsoleSpanExporter()
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        return OTLPSpanExporter()  # endpoint, headers, timeout, compression: OTEL_EXPORTER_OTLP_*

    @staticmethod
    def _context(parent: Parent) -> Context:
        return parent if isinstance(parent, Context) else Context()  # no parent: a new trace

    def start(self, name: str, parent: Parent = None, *, kind: str = "internal",
              attributes: Mapping[str, Value] | None = None) -> Span:
        return _OtelSpan(self._tracer.start_span(name, context=self._context(parent), kind=_KINDS[kind],
                                                 attributes=checked(attributes)))

    def record(self, name: str, parent: Parent, start_s: float, end_s: float,
               attributes: Mapping[str, Value] | None = None) -> None:
        span = self._tracer.start_span(name, context=self._context(parent), attributes=checked(attributes),
                                       start_time=self._ns(start_s))
        span.end(end_time=self._ns(end_s))

    def _ns(self, monotonic_s: float) -> int:
        return int(monotonic_s * 1e9) + self._epoch_offset_ns

    def headers(self, span: Span) -> list[tuple[str, str]]:
        carrier: dict[str, str] = {}
        if isinstance(span, _OtelSpan):
            self._propagator.inject(carrier, context=span.context)
        return list(carrier.items())

    def extract(self, carrier: Iterable[tuple[str, Any]]) -> Parent:
        found = {k.lower(): v for k, v in carrier if k.lower() in _CONTEXT_KEYS and isinstance(v, str)}
        if "traceparent" not in found:
            return None
        context = self._propagator.extract(found)
        return context if trace.get_current_span(context).get_span_context().is_valid else None

    def shutdown(self) -> None:
        self._provider.shutdown()  # exports what is still buffered
