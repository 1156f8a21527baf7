"""What tracing looks like to the roles, and the implementation used when it is off (the default).

``NoTracing`` imports nothing and does nothing: every call returns at once, so a process without
``OTEL_*`` settings pays one attribute lookup and a call per span site (protocol/asgi.py says why
that matters on the gateway's event loop).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from protocol.tracing.attributes import Value

# Where a span's parent comes from: another span, or a remote context extracted from metadata.
Parent = Any


class Span(Protocol):
    def set(self, key: str, value: Value) -> None: ...

    def end(self, error: str = "") -> None: ...

    @property
    def context(self) -> Parent:
        """What to pass as ``parent`` to this span's children."""
        ...


class _NullSpan:
    def set(self, key: str, value: Value) -> None:
        pass

    def end(self, error: str = "") -> None:
        pass

    @property
    def context(self) -> Parent:
        return None


NULL_SPAN: Span = _NullSpan()


class Tracing(Protocol):
    enabled: bool

    def start(self, name: str, parent: Parent = None, *, kind: str = "internal",
              attributes: Mapping[str, Value] | None = None) -> Span:
        """A span started now; end it with ``.end()``. ``kind``: internal, server or client."""
        ...

    def record(self, name: str, parent: Parent, start_s: float, end_s: float,
               attributes: Mapping[str, Value] | None = None) -> None:
        """A finished span between two ``time.monotonic()`` readings (stages measured elsewhere)."""
        ...

    def headers(self, span: Span) -> list[tuple[str, str]]:
        """W3C trace context (``traceparent``, ``tracestate``) naming ``span``, for gRPC metadata or HTTP."""
        ...

    def extract(self, carrier: Iterable[tuple[str, Any]]) -> Parent:
        """The remote parent named by incoming metadata or headers; None if there is none."""
        ...

    def shutdown(self) -> None: ...


class NoTracing:
    enabled = False

    def start(self, name: str, parent: Parent = None, *, kind: str = "internal",
              attributes: Mapping[str, Value] | None = None) -> Span:
        return NULL_SPAN

    def record(self, name: str, parent: Parent, start_s: float, end_s: float,
               attributes: Mapping[str, Value] | None = None) -> None:
        pass

    def headers(self, span: Span) -> list[tuple[str, str]]:
        return []

    def extract(self, carrier: Iterable[tuple[str, Any]]) -> Parent:
        return None

    def shutdown(self) -> None:
        pass
