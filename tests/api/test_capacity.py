"""Adaptive dispatch slots: AIMD on the gateway loop's lag, never below the reserve plus a few shared slots."""

from __future__ import annotations

import asyncio
import time

from api.gateway.admission import AdmissionController
from api.gateway.capacity import AdaptiveCapacity, CapacityPolicy
from api.gateway.fairqueue import FairQueue, FairScheduler
from api.gateway.limits import LocalQueueCounter
from api.gateway.liveness import LoopClock
from policy.limiter import TokenBucketLimiter

LATE, CALM = 0.2, 0.0


def _scheduler(capacity: int = 256, reserved: int = 72) -> FairScheduler:
    return FairScheduler(capacity, reserved, FairQueue(max_queued=10_000, max_queued_per_tenant=10_000))


def _fill(sched: FairScheduler, tenant: str, n: int) -> None:
    for i in range(n):
        sched.queue.push(tenant, i)
    while sched.next() is not None:
        pass


def test_late_turns_cut_the_slots_to_the_floor_and_calm_turns_give_them_back() -> None:
    sched = _scheduler()
    dispatched: list[int] = []
    capacity = AdaptiveCapacity(sched, lambda: dispatched.append(sched.capacity), 256)
    _fill(sched, "bulk", 500)
    assert sched.total_running == 256 - 72  # a bulk tenant gets the shared slots, not the reserve
    for _ in range(50):
        capacity.observe(LATE)
    assert sched.capacity == capacity.floor == 72 + CapacityPolicy().shared_floor
    assert capacity.cuts > 0
    for _ in range(200):
        capacity.observe(CALM)
    assert sched.capacity == 256 and dispatched  # grew back, and each growth dispatched waiting requests


def test_a_late_turn_with_little_running_cuts_nothing() -> None:
    """Lag with nothing to shed (a GC pause, a slow disk) is not the relaying's doing."""
    sched = _scheduler()
    capacity = AdaptiveCapacity(sched, lambda: None, 256)
    _fill(sched, "quiet", 3)
    capacity.observe(LATE)
    assert sched.capacity == 256 and capacity.cuts == 0


def test_the_probe_runs_at_full_rate_only_while_a_cut_could_shed() -> None:
    sched = _scheduler()
    capacity = AdaptiveCapacity(sched, lambda: None, 256)
    _fill(sched, "quiet", 3)
    assert not capacity.sheddable()  # within the floor: a late probe would cut nothing
    _fill(sched, "bulk", 500)
    assert capacity.sheddable()


def test_at_the_floor_a_quiet_tenant_still_starts_at_once_and_the_bulk_tenant_still_runs() -> None:
    sched = _scheduler()
    capacity = AdaptiveCapacity(sched, lambda: None, 256)
    _fill(sched, "bulk", 500)
    for _ in range(50):
        capacity.observe(LATE)
    # Bulk finishes streams; only what fits under the cut slots starts again.
    for _ in range(sched.total_running):
        sched.done("bulk")
    while sched.next() is not None:
        pass
    # The shared slots left at the floor (or the few a tenant with little running may take from the reserve).
    assert CapacityPolicy().shared_floor <= sched.running["bulk"] <= capacity.floor - 72 + sched.small
    sched.queue.push("quiet", "q")
    assert sched.next() == ("quiet", "q")  # from the reserve, with bulk still queued


async def test_the_loop_clock_reports_a_blocked_loop_as_lag_and_the_admission_slots_follow() -> None:
    ctl = AdmissionController(TokenBucketLimiter(), LocalQueueCounter(), max_inflight=64, max_queued=1000,
                              reserved=8, max_request_streams=4)
    capacity = AdaptiveCapacity(ctl.scheduler, ctl.dispatch, 64, CapacityPolicy(shared_floor=4))
    _fill(ctl.scheduler, "bulk", 100)
    clock = LoopClock(tick_s=0.01)
    lags: list[float] = []
    clock.on_tick(lags.append)
    clock.on_tick(capacity.observe)
    clock.start()
    try:
        await asyncio.sleep(0.03)
        time.sleep(0.1)  # the loop is blocked, as when it relays more than it can
        await asyncio.sleep(0.03)
    finally:
        await clock.stop()
    assert max(lags) > 0.05
    assert ctl.scheduler.capacity < 64 and capacity.cuts >= 1


def test_a_cut_below_what_runs_leaves_the_reserve_to_tenants_with_little_in_flight() -> None:
    """Under `sealed bench flood` the cut slots fell below the streams running (they are never
    preempted), no slot was free, and a quiet request waited up to 485 ms for the flood to drain."""
    sched = _scheduler()
    capacity = AdaptiveCapacity(sched, lambda: None, 256)
    _fill(sched, "bulk", 500)
    for _ in range(50):
        capacity.observe(LATE)
    assert sched.capacity - sched.total_running < 0  # cut below what runs: no slot is free
    for _ in range(2):  # a quiet tenant's first request and a second concurrent one start at once
        sched.queue.push("quiet", "q")
        assert sched.next() == ("quiet", "q")
    assert sched.next() is None and sched.queue.queued("bulk")  # bulk still waits for shared slots
    # The reserve is bounded: tenants with little in flight hold at most `reserved` slots beyond the cut.
    for i in range(200):
        sched.queue.push(f"small-{i}", i)
    while sched.next() is not None:
        pass
    assert sum(n for t, n in sched.running.items() if t != "bulk") == sched.reserved


def test_a_late_delivery_probe_cuts_and_holds_back_growth_on_calm_loop_turns() -> None:
    """Under `sealed bench flood` the loop ran thousands of short turns (no lag) while workers'
    chunks waited 40-135 ms in gRPC's path: the loop alone never cut, and the bulk tenant kept it full."""
    sched = _scheduler()
    capacity = AdaptiveCapacity(sched, lambda: None, 256, CapacityPolicy(delivery_hold_s=60.0))
    _fill(sched, "bulk", 500)
    capacity.observe_delivery(0.002)  # within the target: nothing happens
    assert sched.capacity == 256
    for _ in range(50):
        capacity.observe_delivery(0.050)
    assert sched.capacity == capacity.floor == sched.reserved  # down to the reserve, no shared floor
    for _ in range(20):
        capacity.observe(CALM)  # the loop is calm, but answers were late within the hold
    assert sched.capacity == capacity.floor


def test_after_the_hold_calm_turns_grow_the_slots_slowly() -> None:
    sched = _scheduler()
    capacity = AdaptiveCapacity(sched, lambda: None, 256, CapacityPolicy(delivery_hold_s=0.0))
    _fill(sched, "bulk", 500)
    for _ in range(50):
        capacity.observe_delivery(0.050)
    floor = sched.capacity
    capacity.observe(CALM)
    assert sched.capacity == floor + 2  # additive: a 64-stream request does not get in on one calm turn
