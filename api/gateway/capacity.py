"""Dispatch slots that follow what the gateway can relay: AIMD on its loop's lag and on a probe's delay.

`max_inflight` is a ceiling, not a capacity. A late loop turn (liveness.py) or a late delivery probe
(delivery_probe.py) while slots are in use cuts the slots by `decrease`; a calm turn adds a few back
(not within `delivery_hold_s` of a late probe), up to the ceiling. The floor is the reserve of slots
for tenants with little in flight (fairqueue.py). Why and how measured: docs/gateway.md "Adaptive slots".
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from api.gateway.fairqueue import FairScheduler

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CapacityPolicy:
    target_lag_s: float = 0.005  # a ticker turn later than this (at a 0.1 s tick) means the loop is behind
    decrease: float = 0.75  # multiplicative cut per late turn
    increase_fraction: float = 1 / 64  # additive increase per calm turn, as a fraction of the slots
    shared_floor: int = 0  # shared slots (beyond the reserve) that are never taken away
    target_delivery_s: float = 0.010  # a worker's answer queued longer than this in gRPC's path is late
    delivery_hold_s: float = 1.0  # after a late probe, the loop's calm turns do not add slots for this long


class AdaptiveCapacity:
    def __init__(self, scheduler: FairScheduler, dispatch: Callable[[], None], ceiling: int,
                 policy: CapacityPolicy = CapacityPolicy()) -> None:
        self.scheduler, self.dispatch, self.ceiling, self.policy = scheduler, dispatch, ceiling, policy
        self.floor = min(ceiling, scheduler.reserved + policy.shared_floor)
        self.cuts = 0  # late turns that cut the slots (a metric, and what the tests read)
        self._logged_at, self._logged_slots = 0.0, scheduler.capacity
        self._delivery_late_at = float("-inf")

    def observe(self, lag_s: float) -> None:
        """One ticker turn's lag: cut the slots when the loop is behind while they are in use, else grow
        (unless a delivery probe was late within the hold)."""
        if lag_s > self.policy.target_lag_s:
            self._cut(f"event loop {lag_s * 1000:.0f} ms late")
            return
        if time.monotonic() - self._delivery_late_at < self.policy.delivery_hold_s:
            return
        self._grow(lag_s)

    def observe_delivery(self, delay_s: float) -> None:
        """One delivery probe's queueing delay (delivery_probe.py): late means cut, as a late loop turn."""
        if delay_s > self.policy.target_delivery_s:
            self._delivery_late_at = time.monotonic()
            self._cut(f"worker answers queued {delay_s * 1000:.0f} ms")

    def sheddable(self) -> bool:
        """Whether more than the floor's slots are in use: only then does a late signal cut anything."""
        return self.scheduler.total_running > self.floor

    def _cut(self, why: str) -> None:
        sched = self.scheduler
        if self.sheddable():  # relaying is what could be shed
            cut = max(self.floor, int(sched.capacity * self.policy.decrease))
            if cut < sched.capacity:
                sched.capacity = cut
                self.cuts += 1
                self._report(why)

    def _grow(self, lag_s: float) -> None:
        sched = self.scheduler
        if sched.capacity < self.ceiling:
            step = max(2, int(sched.capacity * self.policy.increase_fraction))
            sched.capacity = min(self.ceiling, sched.capacity + step)
            self.dispatch()  # requests waiting for the slots just added start now
            self._report(f"event loop {lag_s * 1000:.0f} ms late")

    def _report(self, why: str) -> None:
        """At most one line per 10 s, and only when the slots moved by a quarter since the last one."""
        now, slots = time.monotonic(), self.scheduler.capacity
        if now - self._logged_at >= 10 and abs(slots - self._logged_slots) * 4 >= max(1, self._logged_slots):
            log.info("dispatch slots %d of %d (%s; %d running)", slots, self.ceiling, why,
                     self.scheduler.total_running)
            self._logged_at, self._logged_slots = now, slots
