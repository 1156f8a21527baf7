"""`sealed bench serve --tracing-sample`'s OTLP sink: what the SDK's real OTLP/HTTP exporter posts is
received, decoded and counted (spans, sampled requests), and the counts are written at SIGTERM."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from api.ports import free_port

ROOT = Path(__file__).resolve().parents[2]


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def test_the_sink_counts_what_a_real_exporter_sends(tmp_path: Path) -> None:
    port, stats = free_port(), tmp_path / "stats.json"
    sink = subprocess.Popen([sys.executable, "-m", "sealed_bench.otlp_sink", "--port", str(port),
                             "--stats", str(stats)], cwd=ROOT)
    try:
        deadline = time.monotonic() + 60  # a hang guard: until the sink listens
        while not _listening(port):
            assert sink.poll() is None and time.monotonic() < deadline, "the sink did not listen"
            threading.Event().wait(0.05)
        provider = TracerProvider()
        # One export per span, at its end: the counts below are exact.
        provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=f"http://127.0.0.1:{port}/v1/traces")))
        tracer = provider.get_tracer("test")
        for _ in range(2):
            with tracer.start_as_current_span("gateway.request"), tracer.start_as_current_span("gateway.route"):
                pass
        with tracer.start_as_current_span("worker.decode"):
            pass
        provider.shutdown()
    finally:
        sink.send_signal(signal.SIGTERM)
        sink.wait(30)
    counts = json.loads(stats.read_text())
    assert counts["by_name"] == {"gateway.request": 2, "gateway.route": 2, "worker.decode": 1}
    assert (counts["requests_sampled"], counts["spans"], counts["exports"]) == (2, 5, 5)
    assert counts["bytes"] > 0


def test_the_tracing_benchmark_runs_the_real_span_paths_and_exports(tmp_path: Path) -> None:
    """`sealed bench tracing` end to end, small: the traced runs' spans reach the sink, sampled at
    the ratio asked (no timing is asserted; the figures are the benchmark's)."""
    import os

    from sealed_bench.bench_tracing import main

    before = {k: v for k, v in os.environ.items() if k.startswith("OTEL_")}
    assert main(["--requests", "300", "--rounds", "1", "--sample", "0.5", "--json", str(tmp_path / "t.json")]) == 0
    report = json.loads((tmp_path / "t.json").read_text())
    assert 0.3 < report["sampled_fraction"] < 0.7  # 500 traced requests at 0.5
    assert report["otlp_sink"]["by_name"]["worker.decode"] == report["otlp_sink"]["requests_sampled"]
    assert {"off", "on", "added_us"} <= set(report["rounds"][0])
    assert {k: v for k, v in os.environ.items() if k.startswith("OTEL_")} == before  # left as found
