"""What the control plane asks for, per model version (parsed from `GET /admin/v1/deployments`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from protocol.model_ref import ModelRef


@dataclass(frozen=True)
class Load:
    queue_depth: float = 0.0  # requests on the version's workers (running + waiting)
    unserved_recent: int = 0  # requests that found no ready worker in the last minute
    ttft_ms: float | None = None


@dataclass(frozen=True)
class VersionSpec:
    tenant: str
    model: str
    version: str
    min_warm: int = 1  # warm-pool floor; 0: may scale to zero
    max_replicas: int = 1
    retired: bool = False
    package: str | None = None  # uploaded package's content address (None: not uploaded, or local)
    ttft_slo_ms: int | None = None
    load: Load = Load()
    registered_workers: tuple[dict[str, Any], ...] = ()  # as the gateway sees them

    @property
    def key(self) -> ModelRef:
        return ModelRef(self.tenant, self.model, self.version)

    @property
    def name(self) -> str:
        return f"{self.tenant}/{self.model}/{self.version}"

    @classmethod
    def from_api(cls, doc: dict[str, Any]) -> VersionSpec:
        load = doc.get("load") or {}
        return cls(tenant=str(doc["tenant"]), model=str(doc["model"]), version=str(doc["version"]),
                   min_warm=int(doc.get("min_warm", 1)), max_replicas=max(1, int(doc.get("max_replicas") or 1)),
                   retired=bool(doc.get("retired")), package=doc.get("package"),
                   ttft_slo_ms=doc.get("ttft_slo_ms"),
                   load=Load(float(load.get("queue_depth") or 0), int(load.get("unserved_recent") or 0),
                             load.get("ttft_ms")),
                   registered_workers=tuple(doc.get("workers") or ()))
