"""A scripted stand-in for the key broker's lease endpoint (worker-side tests): each request gets
the next scripted answer: an HTTP status, a valid MACed answer, a forged one, or a hang."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from protocol.broker.client import lease_answer_mac, lease_mac_key

DATA_KEY = bytes(range(32))
TOKEN_ID = "jti-under-test"


class NoEvidence:
    """The evidence a worker sends with each renewal; the stub appraises nothing."""

    def to_json(self) -> dict[str, Any]:
        return {}


def answer(body: dict[str, Any], status: str, mac_key: bytes, **override: Any) -> dict[str, Any]:
    doc = {"token_id": TOKEN_ID, "seq": body["seq"], "status": status, "lease_s": 60 if status == "active" else 0}
    doc["mac"] = lease_answer_mac(mac_key, doc)
    return {**doc, **override}


# Each script step: (http status, body builder or raw bytes, delay before answering)
def step_json(status: int, make: Any = None, delay: float = 0.0) -> tuple:
    return (status, make, delay)


class StubBroker:
    def __init__(self, script: list[tuple], then: tuple) -> None:
        self.script, self.then = list(script), then
        self.requests: list[dict[str, Any]] = []
        self.mac_key = lease_mac_key(DATA_KEY, TOKEN_ID)
        self.lock = threading.Lock()

    def next_step(self) -> tuple:
        with self.lock:
            return self.script.pop(0) if self.script else self.then


@contextmanager
def stub_broker(script: list[tuple], then: tuple) -> Iterator[tuple[str, StubBroker]]:
    stub = StubBroker(script, then)

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("content-length", 0)))
            body = json.loads(raw or b"{}")
            stub.requests.append(body)
            status, make, delay = stub.next_step()
            if delay:
                time.sleep(delay)
            if isinstance(make, bytes):
                payload = make
            elif callable(make):
                payload = json.dumps(make(body, stub.mac_key)).encode()
            else:
                payload = json.dumps({"error": {"type": "x"}}).encode()
            try:
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)
            except OSError:
                pass

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}", stub
    finally:
        server.shutdown()
        server.server_close()
