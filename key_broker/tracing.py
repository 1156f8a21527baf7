"""The key broker's spans (docs/tracing.md): ``broker.attest`` and ``broker.key_release``, children of
the worker's ``worker.key_release`` when its request carries W3C trace context. Attributes: tenant,
model and the decision; the refusal's reason stays in the audit log (one opaque error at the edge)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from fastapi import Request

from protocol.tracing import NULL_SPAN, Span, Tracing
from protocol.tracing.attributes import MAX_ID


@contextlib.contextmanager
def release_span(request: Request, name: str, tenant: str, model: str) -> Iterator[Span]:
    tracing: Tracing = request.app.state.tracing
    if not tracing.enabled:
        yield NULL_SPAN
        return
    span = tracing.start(name, tracing.extract(request.headers.items()), kind="server", attributes={
        "sealed.tenant": tenant[:MAX_ID], "gen_ai.request.model": model[:MAX_ID]})
    try:
        yield span
    except BaseException as exc:
        span.end(error=type(exc).__name__)
        raise
    span.end()
