"""Real local receivers for the audit forwarder's tests: a test CA (cryptography), an RFC 5425
syslog-over-TLS server that parses octet-counted frames, and an HEC-style HTTP collector."""

from __future__ import annotations

import datetime as dt
import http.server
import json
import socket
import ssl
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


@dataclass
class Pki:
    ca: Path
    cert: Path
    key: Path


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def make_pki(directory: Path, host: str = "localhost", ca_name: str = "test CA") -> Pki:
    """A CA and a server certificate for `host` (DNS name and 127.0.0.1) signed by it."""
    now = dt.datetime.now(dt.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (x509.CertificateBuilder().subject_name(_name(ca_name)).issuer_name(_name(ca_name))
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    import ipaddress
    cert = (x509.CertificateBuilder().subject_name(_name(host)).issuer_name(ca.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(host),
                                                        x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    directory.mkdir(parents=True, exist_ok=True)
    pki = Pki(directory / "ca.pem", directory / "server.pem", directory / "server.key")
    pki.ca.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    pki.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    pki.key.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    return pki


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def read_frames(data: bytes) -> list[bytes]:
    """Split octet-counted frames (RFC 6587 3.4.1); a malformed stream raises ValueError."""
    out = []
    while data:
        length, sep, rest = data.partition(b" ")
        if not sep or not length.isdigit():
            raise ValueError(f"not an octet-counted frame: {data[:40]!r}")
        n = int(length)
        if len(rest) < n:
            raise ValueError("truncated frame")
        out.append(rest[:n])
        data = rest[n:]
    return out


@dataclass
class SyslogServer:
    """Accepts TLS connections, reads each to the end, then records its messages (in order) and
    replies with close_notify. With `dies_after_reading` it instead drops what it read and closes the
    socket bare, as a receiver killed between reading a batch and storing it does."""

    pki: Pki
    port: int = 0
    dies_after_reading: bool = False
    messages: list[bytes] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _got: threading.Condition = field(init=False)

    def __post_init__(self) -> None:
        self._got = threading.Condition(self._lock)
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(self.pki.cert, self.pki.key)
        self._ctx = ctx
        self._sock = socket.create_server(("127.0.0.1", self.port))
        self.port = self._sock.getsockname()[1]
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            try:
                with self._ctx.wrap_socket(conn, server_side=True) as tls:
                    data = b""
                    while chunk := tls.recv(65536):
                        data += chunk
                    if self.dies_after_reading:
                        continue  # leaving the block closes the socket without a close_notify
                    frames = read_frames(data)
                    with self._got:
                        self.messages.extend(frames)
                        self._got.notify_all()
                    tls.unwrap().close()
            except (OSError, ssl.SSLError, ValueError):
                continue

    def wait_for(self, count: int, timeout_s: float = 60.0) -> list[bytes]:
        with self._got:
            self._got.wait_for(lambda: len(self.messages) >= count, timeout_s)
            return list(self.messages)

    def close(self) -> None:
        self._sock.close()


class _Collector(http.server.ThreadingHTTPServer):
    daemon_threads = True
    token = ""
    events: list[dict[str, Any]]
    got: threading.Condition
    sink: Callable[[list[dict[str, Any]]], None] | None = None  # stores a batch before it is acknowledged


class _Handler(http.server.BaseHTTPRequestHandler):
    server: _Collector

    def log_message(self, *args: object) -> None:
        pass

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        if self.headers.get("Authorization") != f"Splunk {self.server.token}":
            self._reply(401, {"text": "Invalid token", "code": 4})
            return
        decoder, text, events = json.JSONDecoder(), body.decode("utf-8"), []
        pos = 0
        while pos < len(text):
            event, pos = decoder.raw_decode(text, pos)
            events.append(event)
        if self.server.sink is not None:
            self.server.sink(events)
        with self.server.got:
            self.server.events.extend(events)
            self.server.got.notify_all()
        self._reply(200, {"text": "Success", "code": 0})

    def _reply(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class HecCollector:
    """An HEC-style collector over TLS on 127.0.0.1; `stop` then `start` restarts it on the same port,
    keeping what it received (as a SIEM's index would)."""

    def __init__(self, token: str, pki: Pki, port: int = 0,
                 sink: Callable[[list[dict[str, Any]]], None] | None = None) -> None:
        self.token, self.sink = token, sink
        self._ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self._ctx.load_cert_chain(pki.cert, pki.key)
        self.events: list[dict[str, Any]] = []
        self.got = threading.Condition()
        self.port = port
        self._server: _Collector | None = None
        self.start()

    def start(self) -> None:
        server = _Collector(("127.0.0.1", self.port), _Handler)
        server.socket = self._ctx.wrap_socket(server.socket, server_side=True)
        server.token, server.events, server.got, server.sink = self.token, self.events, self.got, self.sink
        self.port = server.server_address[1]
        threading.Thread(target=server.serve_forever, daemon=True).start()
        self._server = server

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    @property
    def url(self) -> str:
        return f"https://localhost:{self.port}/services/collector/event"

    def wait_for(self, count: int, timeout_s: float = 60.0) -> list[dict[str, Any]]:
        with self.got:
            self.got.wait_for(lambda: len(self.events) >= count, timeout_s)
            return list(self.events)
