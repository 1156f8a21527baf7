"""The gateway's spans of one request (docs/tracing.md): ``gateway.request`` (the whole request,
continuing the client's trace if its headers carry one), ``gateway.admission`` (the wait for a
slot), ``gateway.route`` (picking a worker) and ``gateway.worker_call`` (the gRPC call, whose
context travels to the worker as W3C ``traceparent`` metadata).

Only ids, sizes and counts the gateway already handles go on them (protocol/tracing/attributes.py);
with tracing off (the default) each site costs one attribute lookup.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from protocol.tracing import NULL_SPAN, Span, Tracing


def request_span(tracing: Tracing, headers: Any, *, request_id: str, tenant: str, model: str, sealed: bool,
                 choices: int = 1, stream: bool = True, body_bytes: int | None = None) -> Span:
    if not tracing.enabled:
        return NULL_SPAN
    pairs: Iterable[tuple[str, Any]] = headers.items() if headers is not None else ()
    attributes: dict[str, str | int | bool] = {
        "sealed.request_id": request_id, "sealed.tenant": tenant, "gen_ai.request.model": model,
        "sealed.sealed": sealed, "sealed.choices": choices, "sealed.stream": stream}
    if body_bytes is not None:  # sealed mode: the ciphertext's size, which the gateway sees anyway
        attributes["sealed.body_bytes"] = body_bytes
    return tracing.start("gateway.request", tracing.extract(pairs), kind="server", attributes=attributes)


def worker_call_span(tracing: Tracing, parent: Span, method: str, worker_id: str) -> tuple[Span, list[Any] | None]:
    """The client span of one gRPC call and the metadata that carries its context (None when off)."""
    if not tracing.enabled:
        return NULL_SPAN, None
    span = tracing.start("gateway.worker_call", parent.context, kind="client", attributes={
        "rpc.system": "grpc", "rpc.service": "sealed.Worker", "rpc.method": method, "sealed.worker_id": worker_id})
    return span, tracing.headers(span)
