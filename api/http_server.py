"""The control plane's HTTP server (gateway, management API and console in one process, api/serve.py):
uvicorn with limits on how long and how many connections a client holds.

HTTP/1.1 is parsed by httptools (llhttp) when installed, else h11. Neither of uvicorn's protocols
times out a request's headers: the guard below closes a connection whose headers are not complete
within `header_timeout_s` (from connect, and after each response on a kept-alive connection),
refuses connections beyond `max_connections`, and bounds header bytes (h11: its incomplete-event
limit; httptools: counted here, 400 and close beyond `max_header_bytes`). The event loop: asyncio's
with light tenants first (priority_loop.py), also where uvloop is installed; uvloop only when asked
for (`--loop uvloop`; missing, an error). docs/gateway.md has the measurements behind both.
"""

from __future__ import annotations

import asyncio
import importlib.util
import sys
from dataclasses import dataclass
from typing import Any, Literal

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

Http = Literal["auto", "httptools", "h11"]
# What uvicorn builds the loop with: asyncio's selector loop with light tenants' callbacks first
# (priority_loop.py), or uvloop's.
LOOP_FACTORIES = {"asyncio": "api.gateway.priority_loop:PriorityEventLoop", "uvloop": "uvloop"}
Loop = Literal["auto", "uvloop", "asyncio"]


@dataclass(frozen=True)
class ConnectionLimits:
    header_timeout_s: float = 10.0  # connect -> end of headers
    keep_alive_s: float = 5.0  # idle between requests on one connection
    max_connections: int = 4096  # open at once; beyond: closed at accept
    max_header_bytes: int = 64 << 10


def base_protocol(http: Http = "auto") -> type[asyncio.Protocol]:
    """uvicorn's httptools protocol if httptools is installed (or asked for), else its h11 one."""
    if http == "httptools" or (http == "auto" and importlib.util.find_spec("httptools") is not None):
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

        return HttpToolsProtocol
    return H11Protocol


def event_loop(loop: Loop = "auto") -> Literal["uvloop", "asyncio"]:
    """asyncio's loop (with priorities, LOOP_FACTORIES) unless uvloop is asked for: uvicorn's `loop` setting."""
    if loop == "auto":
        return "asyncio"
    if loop == "uvloop" and importlib.util.find_spec("uvloop") is None:
        raise RuntimeError("loop 'uvloop' was asked for but uvloop is not installed")
    return loop


def shorten_gil_switch_interval(interval_s: float = 0.001) -> None:
    """Let the gateway's helper threads (key look-ups, the usage writer, gRPC's callbacks) get the GIL
    back from the event loop within `interval_s` (docs/gateway.md "The GIL is handed back within 1 ms")."""
    if not 0 < interval_s <= 0.1:
        raise ValueError("the GIL switch interval must be in (0, 0.1] seconds")
    sys.setswitchinterval(interval_s)


def guarded_protocol(limits: ConnectionLimits, http: Http = "auto") -> type[asyncio.Protocol]:
    base: Any = base_protocol(http)

    class GuardedProtocol(base):  # whichever of uvicorn's two protocols is installed
        """Uses only what both uvicorn protocols have: `connections`, `loop`, `transport`, `cycle`
        (None, or the latest request's, with `response_complete`), `on_response_complete`."""

        _header_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:
            super().connection_made(transport)
            if len(self.connections) > limits.max_connections:
                transport.abort()
                return
            self._arm()

        def _arm(self) -> None:
            self._disarm()
            self._header_timer = self.loop.call_later(limits.header_timeout_s, self._headers_too_slow)

        def _disarm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _headers_too_slow(self) -> None:
            self._header_timer = None
            if self.cycle is None or self.cycle.response_complete:
                self.transport.abort()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self.cycle is not None and not self.cycle.response_complete:
                self._disarm()  # headers complete: the request runs (its own timeouts apply)

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self._arm()  # the next request's headers get the same deadline

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

    if base is H11Protocol:
        return GuardedProtocol  # h11 bounds header bytes itself (h11_max_incomplete_event_size)

    class GuardedHttpToolsProtocol(GuardedProtocol):
        """Counts the bytes received while a request's headers are incomplete (from its first byte
        to the end of its headers; llhttp would buffer an endless header value until the deadline)."""

        _in_headers = False
        _header_bytes = 0

        def on_message_begin(self) -> None:
            self._in_headers, self._header_bytes = True, 0
            super().on_message_begin()

        def on_headers_complete(self) -> None:
            self._in_headers = False
            super().on_headers_complete()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self._in_headers and not self.transport.is_closing():
                self._header_bytes += len(data)
                if self._header_bytes > limits.max_header_bytes:
                    if self.cycle is None or self.cycle.response_complete:
                        self.send_400_response("Request headers too large.")  # and closes
                    else:  # pipelined behind a response still being sent: never write into it
                        self.transport.abort()

    return GuardedHttpToolsProtocol


def server_config(app: Any, host: str, port: int, limits: ConnectionLimits | None = None, http: Http = "auto",
                  loop: Loop = "auto", **kw: Any) -> uvicorn.Config:
    limits = limits or ConnectionLimits()
    # access_log off: request lines are metadata, but we keep the gateway's logs to decisions only.
    return uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False,
                          timeout_keep_alive=int(limits.keep_alive_s), http=guarded_protocol(limits, http),
                          loop=LOOP_FACTORIES[event_loop(loop)], h11_max_incomplete_event_size=limits.max_header_bytes,
                          **kw)
