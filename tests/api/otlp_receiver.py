"""An OTLP/HTTP trace receiver in the test process: what a collector would get from each role."""

from __future__ import annotations

import gzip
import http.server
import threading
from dataclasses import dataclass
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)


@dataclass(frozen=True)
class ReceivedSpan:
    service: str
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    kind: int
    attributes: dict[str, Any]
    start_ns: int
    end_ns: int


def _value(v: Any) -> Any:
    return getattr(v, v.WhichOneof("value")) if v.WhichOneof("value") else None


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    receiver: OtlpReceiver


class _Handler(http.server.BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, *args: object) -> None:
        pass

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        if self.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        self.server.receiver.add(body)
        reply = ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)


class OtlpReceiver:
    def __init__(self) -> None:
        self.raw: list[bytes] = []  # every export exactly as received (a canary is looked for here)
        self.spans: list[ReceivedSpan] = []
        self.got = threading.Condition()
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.receiver = self
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def add(self, body: bytes) -> None:
        request = ExportTraceServiceRequest.FromString(body)
        spans = []
        for rs in request.resource_spans:
            service = next((_value(a.value) for a in rs.resource.attributes if a.key == "service.name"), "")
            for ss in rs.scope_spans:
                for s in ss.spans:
                    spans.append(ReceivedSpan(service, s.name, s.trace_id.hex(), s.span_id.hex(),
                                              s.parent_span_id.hex(), s.kind,
                                              {a.key: _value(a.value) for a in s.attributes},
                                              s.start_time_unix_nano, s.end_time_unix_nano))
        with self.got:
            self.raw.append(body)
            self.spans.extend(spans)
            self.got.notify_all()

    def wait_for(self, predicate: Any, timeout_s: float = 120.0) -> list[ReceivedSpan]:
        with self.got:
            self.got.wait_for(lambda: predicate(self.spans), timeout_s)
            return list(self.spans)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
