"""Tracing is off unless OTEL_* asks, refuses any attribute that is not an id, size or count, and
carries W3C trace context across a hop (the SDK's in-memory exporter collects the spans)."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from protocol.tracing import NULL_SPAN, NoTracing, TracingError, TracingSettings, tracing_from_env
from protocol.tracing.attributes import checked


@pytest.mark.parametrize("env", [{}, {"OTEL_SERVICE_NAME": "x"}, {"OTEL_TRACES_EXPORTER": "none",
                                                                  "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"},
                                 {"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "otlp"}])
def test_off_unless_the_environment_asks(env: dict[str, str]) -> None:
    tracing = tracing_from_env("gateway", env)
    assert isinstance(tracing, NoTracing) and not tracing.enabled
    assert tracing.start("x") is NULL_SPAN and tracing.headers(NULL_SPAN) == []
    assert tracing.extract([("traceparent", "00-" + "1" * 32 + "-" + "2" * 16 + "-01")]) is None


@pytest.mark.parametrize("env", [{"OTEL_TRACES_EXPORTER": "otlp"}, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"},
                                 {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"}])
def test_on_when_an_exporter_or_endpoint_is_named(env: dict[str, str]) -> None:
    assert TracingSettings.from_env(env).enabled


def test_bad_settings_are_refused() -> None:
    with pytest.raises(TracingError):
        TracingSettings.from_env({"OTEL_TRACES_EXPORTER": "zipkin"})
    with pytest.raises(TracingError, match="http/protobuf"):
        TracingSettings.from_env({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"})


def test_off_imports_no_opentelemetry() -> None:
    """Zero cost when off (protocol/asgi.py): not even the SDK's import."""
    code = ("import sys; from protocol.tracing import tracing_from_env; t = tracing_from_env('worker', {}); "
            "t.start('x').end(); print(any(m.startswith('opentelemetry') for m in sys.modules))")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert run.stdout.strip() == "False"


@pytest.mark.parametrize("attributes", [{"sealed.prompt": "hello"}, {"gen_ai.prompt": "x"},
                                        {"sealed.request_id": "x" * 200}, {"sealed.tenant": 3.5j},
                                        {"sealed.request_id": 5}, {"gen_ai.usage.input_tokens": "12"}])
def test_anything_but_ids_sizes_and_counts_is_refused(attributes: dict) -> None:
    with pytest.raises(TracingError):
        checked(attributes)
    tracing = tracing_from_env("gateway", {}, exporter=InMemorySpanExporter())
    with pytest.raises(TracingError):
        tracing.start("x", attributes=attributes)
    span = tracing.start("y")
    with pytest.raises(TracingError):
        span.set(*next(iter(attributes.items())))


def test_context_crosses_a_hop_and_recorded_stages_nest() -> None:
    exporters = InMemorySpanExporter(), InMemorySpanExporter()  # one per process, as deployed
    gateway = tracing_from_env("gateway", {}, exporter=exporters[0])
    worker = tracing_from_env("worker", {}, exporter=exporters[1])
    root = gateway.start("gateway.request", kind="server", attributes={"sealed.request_id": "r1"})
    call = gateway.start("gateway.worker_call", root.context, kind="client")
    metadata = gateway.headers(call)
    assert [k for k, _ in metadata] == ["traceparent"]
    served = worker.start("worker.Generate", worker.extract(metadata), kind="server")
    worker.record("worker.prefill", served.context, 10.0, 10.5, {"gen_ai.usage.input_tokens": 7})
    for span in (served, call, root):
        span.end()
    gateway.shutdown()
    worker.shutdown()
    spans: dict[str, Any] = {s.name: s for e in exporters for s in e.get_finished_spans()}
    trace_id = spans["gateway.request"].context.trace_id
    assert {s.context.trace_id for s in spans.values()} == {trace_id}
    assert spans["worker.Generate"].parent.span_id == spans["gateway.worker_call"].context.span_id
    assert spans["worker.Generate"].parent.is_remote
    assert spans["worker.prefill"].parent.span_id == spans["worker.Generate"].context.span_id
    assert spans["worker.prefill"].end_time - spans["worker.prefill"].start_time == 500_000_000
    assert spans["worker.Generate"].resource.attributes["service.name"] == "sealed-worker"


@pytest.mark.parametrize("bad", ["", "garbage", "00-" + "0" * 32 + "-" + "0" * 16 + "-01"])
def test_a_missing_or_invalid_traceparent_starts_a_new_trace(bad: str) -> None:
    tracing = tracing_from_env("worker", {}, exporter=InMemorySpanExporter())
    assert tracing.extract([("traceparent", bad)] if bad else []) is None
