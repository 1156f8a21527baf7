"""The gateway's HTTP server: uvicorn with limits on how long and how many connections a client holds.

uvicorn (h11) has a keep-alive timeout but none for a request's headers: a client that connects and
sends half a request line holds the connection (and its memory) forever. `GuardedH11Protocol` closes
a connection whose headers are not complete within `header_timeout_s` (from connect, and again after
each response on a kept-alive connection), and refuses connections beyond `max_connections` at once.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol


@dataclass(frozen=True)
class ConnectionLimits:
    header_timeout_s: float = 10.0  # connect -> end of headers
    keep_alive_s: float = 5.0  # idle between requests on one connection
    max_connections: int = 4096  # open at once; beyond: closed at accept
    max_header_bytes: int = 64 << 10


def guarded_protocol(limits: ConnectionLimits) -> type[H11Protocol]:
    class GuardedH11Protocol(H11Protocol):
        _header_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
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

    return GuardedH11Protocol


def server_config(app: Any, host: str, port: int, limits: ConnectionLimits | None = None, **kw: Any
                  ) -> uvicorn.Config:
    limits = limits or ConnectionLimits()
    # access_log off: request lines are metadata, but we keep the gateway's logs to decisions only.
    return uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False,
                          timeout_keep_alive=int(limits.keep_alive_s), http=guarded_protocol(limits),  # type: ignore[arg-type]
                          h11_max_incomplete_event_size=limits.max_header_bytes, **kw)
