"""Load per model version, as the control loop and the autoscaler see it.

- queue depth: requests on a version's workers (dispatched by this gateway and waiting in their
  engines), from the heartbeats; keyed by ModelRef;
- unserved demand: requests that found no ready worker for a model (cold, scaled to zero, or
  failing) in the last `window_s`; they got a retryable 503, and they are what wakes a version
  that scaled to zero. Per (tenant, model): a request names a model, routing picks the version;
- time to first token: an exponentially weighted mean per model, against the version's SLO.

Exported to Prometheus (`sealed:model_queue_depth`, `sealed:model_unserved_requests`) for KEDA,
and to the control loop through `GET /admin/v1/deployments`.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Gauge

from protocol.model_ref import ModelRef

TTFT_ALPHA = 0.2


class Demand:
    def __init__(self, registry: CollectorRegistry | None = None, window_s: float = 60.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.window_s = window_s
        self._clock = clock
        self._unserved: dict[tuple[str, str], deque[float]] = {}
        self._ttft: dict[tuple[str, str], float] = {}
        self._queue: dict[ModelRef, float] = {}
        self.queue_gauge = Gauge("sealed:model_queue_depth", "Requests on a model version's workers "
                                 "(running and waiting)", ["tenant", "model_name", "version"], registry=registry)
        self.unserved_gauge = Gauge("sealed:model_unserved_requests", "Requests that found no ready worker for "
                                    "the model in the last minute", ["tenant", "model_name"], registry=registry)

    def unserved(self, tenant: str, model: str) -> None:
        q = self._unserved.setdefault((tenant, model), deque(maxlen=10_000))
        q.append(self._clock())
        self.unserved_gauge.labels(tenant, model).set(self.recent_unserved(tenant, model))

    def recent_unserved(self, tenant: str, model: str) -> int:
        q = self._unserved.get((tenant, model))
        if not q:
            return 0
        horizon = self._clock() - self.window_s
        while q and q[0] < horizon:
            q.popleft()
        return len(q)

    def ttft(self, tenant: str, model: str, seconds: float) -> None:
        key = (tenant, model)
        old = self._ttft.get(key)
        self._ttft[key] = seconds if old is None else (1 - TTFT_ALPHA) * old + TTFT_ALPHA * seconds

    def ttft_mean(self, tenant: str, model: str) -> float | None:
        return self._ttft.get((tenant, model))

    def set_queue(self, ref: ModelRef, depth: float) -> None:
        self._queue[ref] = depth
        self.queue_gauge.labels(ref.tenant, ref.model, ref.version).set(depth)

    def refresh(self) -> None:
        """Age the unserved counts of the gauge (called on scrape and by the deployments route)."""
        for tenant, model in list(self._unserved):
            self.unserved_gauge.labels(tenant, model).set(self.recent_unserved(tenant, model))
