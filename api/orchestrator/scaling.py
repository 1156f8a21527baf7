"""Replicas per version from load: a floor (warm pool), a ceiling, scale to zero where allowed.

Scale out at once when the queue per replica passes `target_queue`, or when the mean TTFT is over
the version's SLO while requests wait; scale in one replica at a time, and only after the load has
stayed low for `scale_in_after_s` (no flapping). A version at zero wakes on the first request that
found no worker (it got a retryable 503 and counts as unserved demand).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from api.orchestrator.spec import VersionSpec


@dataclass(frozen=True)
class ScalingPolicy:
    target_queue: float = 4.0  # requests per replica before adding one
    scale_in_after_s: float = 60.0


def wanted_replicas(spec: VersionSpec, current: int, low_since: float | None, now: float,
                    policy: ScalingPolicy = ScalingPolicy()) -> int:
    """How many workers the version should have now; `low_since` is when its load last fell below
    what `current - 1` replicas could carry (None: it has not)."""
    if spec.retired:
        return 0
    load = spec.load
    want = math.ceil(load.queue_depth / policy.target_queue) if load.queue_depth > 0 else 0
    if load.unserved_recent > 0:
        want = max(want, 1)  # wake from zero
    slo_missed = (spec.ttft_slo_ms is not None and load.ttft_ms is not None and load.ttft_ms > spec.ttft_slo_ms
                  and load.queue_depth > 0)
    if slo_missed:
        want = max(want, current + 1)
    want = max(spec.min_warm, min(spec.max_replicas, want))
    if want < current:
        # Scale in slowly: one at a time, after the load has been low for a while.
        if low_since is None or now - low_since < policy.scale_in_after_s:
            return current
        return current - 1
    return want


def is_low(spec: VersionSpec, current: int, policy: ScalingPolicy = ScalingPolicy()) -> bool:
    """Could one replica fewer carry the load?"""
    if current <= spec.min_warm:
        return False
    return spec.load.unserved_recent == 0 and spec.load.queue_depth <= (current - 1) * policy.target_queue * 0.5
