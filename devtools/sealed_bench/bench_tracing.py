"""`sealed bench tracing`: the CPU that tracing adds to one request, measured on the code paths a
request takes, with tracing off (NoTracing) and on at a sampling ratio (the real OtelTracing: the
SDK's sampler from OTEL_TRACES_SAMPLER(_ARG), its batch processor, its OTLP/HTTP exporter posting to
a local sink process, sealed_bench/otlp_sink.py).

One request's tracing work, as the roles do it: the gateway's ``gateway.request`` (from headers),
``gateway.admission``, ``gateway.route`` and ``gateway.worker_call`` with its traceparent metadata
(api/gateway/spans.py), then the worker's extract of that metadata, its ``worker.Generate`` server
span and the stage spans (enclave_worker/stage_times.py). Both roles in this one process; CPU time
is the process's (every thread: the export runs in the batch processor's), including the final
flush. Served throughput on a loaded machine moves by far more than this (docs/benchmarks.md); the
CPU per request is the figure that says what tracing costs a CPU-bound deployment.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sealed_bench.serve_sealed import _free_port, _machine
from sealed_bench.serve_tracing import tracing_env

WARMUP = 200


def _wait_listening(port: int) -> None:
    import socket

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError("the OTLP sink did not listen")


@contextlib.contextmanager
def _environ(updates: dict[str, str]) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in updates}
    os.environ.update(updates)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _one_request(tracing: Any, i: int) -> None:
    from api.gateway.spans import request_span, worker_call_span
    from enclave_worker.stage_times import StageTimes, record_stages

    span = request_span(tracing, {"content-type": "application/json"}, request_id=f"req-{i}", tenant="demo",
                        model="m", sealed=False)
    tracing.start("gateway.admission", span.context).end()
    route = tracing.start("gateway.route", span.context)
    if tracing.enabled:
        route.set("sealed.worker_id", "w1")
    route.end()
    call, metadata = worker_call_span(tracing, span, "Generate", "w1")
    if tracing.enabled:  # the worker's side of the hop (enclave_worker/servicer.py server_span)
        server = tracing.start("worker.Generate", tracing.extract(metadata or ()), kind="server",
                               attributes={"rpc.system": "grpc", "rpc.service": "sealed.Worker",
                                           "rpc.method": "Generate", "sealed.request_id": f"req-{i}"})
        now = time.monotonic()
        record_stages(tracing, server.context, StageTimes(now - 0.03, now - 0.02, now - 0.01), (128, 64),
                      sealed=False)
        server.end()
    call.end()
    span.end()


def _measure(tracing: Any, requests: int) -> float:
    """CPU microseconds per request (all threads), the final export included."""
    for i in range(min(requests, WARMUP)):  # warm-up: imports, first export's connection
        _one_request(tracing, i)
    start = time.process_time()
    for i in range(requests):
        _one_request(tracing, i)
    tracing.shutdown()
    return 1e6 * (time.process_time() - start) / requests


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="sealed bench tracing", description=__doc__)
    p.add_argument("--sample", type=float, default=0.1, help="sampling ratio with tracing on")
    p.add_argument("--requests", type=int, default=20000)
    p.add_argument("--rounds", type=int, default=5, help="off/on rounds, alternating")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    from protocol.tracing import tracing_from_env

    with tempfile.TemporaryDirectory() as scratch:
        port, stats = _free_port(), Path(scratch) / "sink.json"
        sink = subprocess.Popen([sys.executable, "-m", "sealed_bench.otlp_sink", "--port", str(port),
                                 "--stats", str(stats)])
        try:
            _wait_listening(port)
            rounds: list[dict[str, float]] = []
            for r in range(args.rounds):
                figures: dict[str, float] = {}
                for mode in (("off", "on") if r % 2 == 0 else ("on", "off")):
                    # The SDK reads its sampler and endpoint from os.environ: set for the run only.
                    with _environ(tracing_env(port, args.sample) if mode == "on" else {}):
                        figures[mode] = _measure(tracing_from_env("bench"), args.requests)
                figures["added_us"] = figures["on"] - figures["off"]
                rounds.append(figures)
                print(f"round {r + 1}: off {figures['off']:.1f} us/request, on {figures['on']:.1f} us/request "
                      f"(+{figures['added_us']:.1f} us), load {os.getloadavg()[0]:.1f}", flush=True)
        finally:
            sink.send_signal(signal.SIGTERM)
            sink.wait(60)
        received = json.loads(stats.read_text()) if stats.exists() else {}
    added = sorted(x["added_us"] for x in rounds)
    sent_traced = (args.requests + min(args.requests, WARMUP)) * args.rounds  # requests made with tracing on
    report = {"conditions": {k: str(v) for k, v in vars(args).items()}, "machine": _machine(),
              "loadavg": os.getloadavg(), "rounds": rounds, "added_us_per_request_median": added[len(added) // 2],
              "otlp_sink": received,
              "sampled_fraction": received.get("requests_sampled", 0) / (sent_traced or 1)}
    print(f"tracing at {args.sample:.0%} sampling adds {report['added_us_per_request_median']:.1f} us of CPU per "
          f"request (median of {args.rounds}); sampled {report['sampled_fraction']:.3f} of requests "
          f"({received.get('spans', 0)} spans exported)")
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    return 0
