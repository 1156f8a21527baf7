"""A local OTLP/HTTP trace receiver for `sealed bench serve --tracing-sample`: it accepts what the
roles' real OTLP exporters post to /v1/traces, counts spans and sampled requests, and keeps nothing.

The exporters do their whole job (batching, protobuf encoding, an HTTP POST per batch); only the
collector's own work is left out, as it would run on another machine. It runs as its own process so
that its decoding does not take the load generator's GIL.

    python -m sealed_bench.otlp_sink --port P --stats FILE   (SIGTERM: write the counts to FILE, exit)
"""

from __future__ import annotations

import argparse
import http.server
import json
import signal
import threading
from pathlib import Path
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

ROOT_SPAN = "gateway.request"  # one per sampled request


class _Sink(http.server.ThreadingHTTPServer):
    daemon_threads = True
    counts: dict[str, Any]
    lock: threading.Lock


class _Handler(http.server.BaseHTTPRequestHandler):
    server: _Sink

    def log_message(self, *args: object) -> None:
        pass

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        if self.path != "/v1/traces":
            self.send_error(404)
            return
        request = ExportTraceServiceRequest.FromString(body)
        spans = [span for rs in request.resource_spans for ss in rs.scope_spans for span in ss.spans]
        with self.server.lock:
            c = self.server.counts
            c["exports"] += 1
            c["bytes"] += len(body)
            c["spans"] += len(spans)
            c["requests_sampled"] += sum(1 for s in spans if s.name == ROOT_SPAN)
            for s in spans:
                c["by_name"][s.name] = c["by_name"].get(s.name, 0) + 1
        reply = ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m sealed_bench.otlp_sink")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--stats", type=Path, required=True)
    args = parser.parse_args()
    sink = _Sink(("127.0.0.1", args.port), _Handler)
    sink.counts = {"exports": 0, "bytes": 0, "spans": 0, "requests_sampled": 0, "by_name": {}}
    sink.lock = threading.Lock()
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    threading.Thread(target=sink.serve_forever, daemon=True).start()
    done.wait()
    sink.shutdown()
    with sink.lock:
        args.stats.write_text(json.dumps(sink.counts, indent=1, sort_keys=True))


if __name__ == "__main__":
    main()
