"""Gateway settings: explicit and frozen; placeholder secrets are refused outside dev."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class WorkerRoute:
    """A worker serving one tenant's model version. `model` is the public model id."""

    url: str
    tenant: str
    model: str
    version: str


@dataclass(frozen=True)
class GatewaySettings:
    data_dir: Path
    workers: tuple[WorkerRoute, ...] = field(default_factory=tuple)
    dev: bool = False
    request_timeout_s: float = 600.0
    status_cache_s: float = 1.0
    max_body_bytes: int = 4 << 20
