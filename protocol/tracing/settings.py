"""Whether this process traces, from the standard OpenTelemetry environment variables.

Off unless asked for: ``OTEL_TRACES_EXPORTER=otlp`` (or ``console``), or an OTLP endpoint
(``OTEL_EXPORTER_OTLP_ENDPOINT`` / ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``) with no exporter named.
``OTEL_SDK_DISABLED=true`` or ``OTEL_TRACES_EXPORTER=none`` turns it off whatever else is set.
Everything else (endpoint, headers, timeout, ``OTEL_TRACES_SAMPLER``/``_ARG``, ``OTEL_BSP_*``,
``OTEL_RESOURCE_ATTRIBUTES``) is read by the OpenTelemetry SDK itself.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from protocol.tracing.attributes import TracingError

EXPORTERS = ("otlp", "console", "none")
PROTOCOLS = ("http/protobuf",)


@dataclass(frozen=True)
class TracingSettings:
    exporter: str = "none"  # otlp | console | none

    def __post_init__(self) -> None:
        if self.exporter not in EXPORTERS:
            raise TracingError(f"OTEL_TRACES_EXPORTER must be one of {', '.join(EXPORTERS)}")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> TracingSettings:
        env = os.environ if environ is None else environ
        if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
            return cls("none")
        named = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
        endpoint = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        exporter = named or ("otlp" if endpoint else "none")
        if exporter == "otlp":
            protocol = (env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or env.get("OTEL_EXPORTER_OTLP_PROTOCOL")
                        or "http/protobuf").strip().lower()
            if protocol not in PROTOCOLS:
                raise TracingError(f"OTLP protocol {protocol!r} is not supported here (use http/protobuf)")
        return cls(exporter)

    @property
    def enabled(self) -> bool:
        return self.exporter != "none"
