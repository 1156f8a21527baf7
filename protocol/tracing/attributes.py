"""The only attributes a span may carry: ids, sizes and counts, by name. Anything else is refused.

A string value is allowed only under an id key (request and worker ids, tenant, model, outcome
words); numbers and booleans only under a size or count key. Text from a request or an answer has
no key to go under.
"""

from __future__ import annotations

from collections.abc import Mapping

# Strings: identifiers and fixed words the gateway, worker or broker chose (never request content).
ID_KEYS = frozenset({
    "sealed.request_id", "sealed.tenant", "sealed.worker_id", "sealed.component", "sealed.route",
    "sealed.finish_reason", "sealed.decision", "sealed.endpoint", "sealed.error", "gen_ai.request.model",
    "gen_ai.system", "rpc.system", "rpc.service", "rpc.method", "http.request.method",
})
# Numbers and booleans: sizes, counts, flags.
COUNT_KEYS = frozenset({
    "sealed.sealed", "sealed.stream", "sealed.choices", "sealed.attempts", "sealed.queue_included",
    "sealed.body_bytes", "sealed.queued_requests", "sealed.reserved_tokens",
    "gen_ai.usage.input_tokens", "gen_ai.usage.output_tokens", "http.response.status_code",
})
MAX_ID = 128

Value = str | int | float | bool


class TracingError(ValueError):
    """A span attribute that is not an allow-listed id, size or count."""


def checked(attributes: Mapping[str, Value] | None) -> dict[str, Value]:
    """The attributes as given, once each is allowed; raises TracingError otherwise."""
    out: dict[str, Value] = {}
    for key, value in (attributes or {}).items():
        if isinstance(value, str):
            if key not in ID_KEYS:
                raise TracingError(f"span attribute {key!r} may not hold text")
            if len(value) > MAX_ID:
                raise TracingError(f"span attribute {key!r} is longer than an id")
        elif isinstance(value, bool | int | float):
            if key not in COUNT_KEYS:
                raise TracingError(f"span attribute {key!r} is not an allowed size or count")
        else:
            raise TracingError(f"span attribute {key!r} has an unsupported type")
        out[key] = value
    return out
