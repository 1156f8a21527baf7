"""Weighted fair queueing across tenants, with strict priority classes and bounded queues.

Start-time fair queueing (SFQ): each queued request gets a start tag max(V, the tenant's last finish
tag) and a finish tag start + cost / weight; the queue serves the smallest start tag, and the
virtual time V follows the start tag of the request last served. A tenant that floods the queue
only pushes its own tags forward, so a quiet tenant's next request is served after at most about
one request of every other backlogged tenant. Pure and synchronous: the asyncio layer and the
simulation test both drive it.
"""

from __future__ import annotations

import heapq
import itertools
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from api.errors import SealedApiError


class QueueFull(SealedApiError):
    def __init__(self, scope: str) -> None:
        super().__init__(f"queue full ({scope})")
        self.scope = scope


@dataclass(eq=False)
class _Entry:
    sort_key: tuple[int, float, int]
    tenant: str
    item: Any
    start: float
    cancelled: bool = field(default=False)
    cost: int = field(default=1)


Lane = tuple[str, int]  # (tenant, priority): one FIFO of entries


class FairQueue:
    """Entries wait in one FIFO per (tenant, priority) lane; a heap holds only each lane's head.

    Within a lane, start tags never decrease (both V and a tenant's finish tag only grow), so the
    head is the lane's smallest tag and the heap of heads orders the whole queue: a pop that skips
    ineligible tenants costs O(lanes log lanes), not O(queued).
    """

    def __init__(self, max_queued: int = 1024, max_queued_per_tenant: int = 256) -> None:
        self.max_queued = max_queued
        self.max_queued_per_tenant = max_queued_per_tenant
        self._lanes: dict[Lane, deque[_Entry]] = {}
        self._heads: list[tuple[tuple[int, float, int], Lane]] = []  # (head's sort key, lane); one per lane
        self._finish: dict[str, float] = {}
        self._vtime = 0.0
        self._seq = itertools.count()
        self._per_tenant: Counter[str] = Counter()
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def queued(self, tenant: str) -> int:
        return self._per_tenant[tenant]

    def push(self, tenant: str, item: Any, *, weight: float = 1.0, cost: float = 1.0, priority: int = 0,
             tenant_limit: int | None = None) -> _Entry:
        if self._size >= self.max_queued:
            raise QueueFull("gateway")
        if self._per_tenant[tenant] >= (tenant_limit or self.max_queued_per_tenant):
            raise QueueFull("tenant")
        start = max(self._vtime, self._finish.get(tenant, 0.0))
        self._finish[tenant] = start + cost / max(weight, 1e-6)
        entry = _Entry((-priority, start, next(self._seq)), tenant, item, start, cost=max(1, int(cost)))
        lane = (tenant, priority)
        fifo = self._lanes.get(lane)
        if fifo is None:  # a new lane: its head goes on the heap
            self._lanes[lane] = deque([entry])
            heapq.heappush(self._heads, (entry.sort_key, lane))
        else:
            fifo.append(entry)
        self._per_tenant[tenant] += 1
        self._size += 1
        return entry

    def cancel(self, entry: _Entry) -> None:
        """Lazy removal (the caller gave up waiting); the slot in the bound is freed now."""
        if not entry.cancelled:
            entry.cancelled = True
            self._per_tenant[entry.tenant] -= 1
            self._size -= 1

    def _live_head(self, lane: Lane) -> _Entry | None:
        """The lane's first entry not cancelled; drops the cancelled ones and empty lanes."""
        fifo = self._lanes[lane]
        while fifo and fifo[0].cancelled:
            fifo.popleft()
        if not fifo:
            del self._lanes[lane]
            return None
        return fifo[0]

    def pop_entry(self, eligible: Callable[[str, int], bool] = lambda _t, _c: True) -> _Entry | None:
        """The first entry in fair order for which `eligible(tenant, cost)` holds (its lane's head); the
        others keep their place."""
        skipped: list[tuple[tuple[int, float, int], Lane]] = []
        found = None
        while self._heads:
            key, lane = heapq.heappop(self._heads)
            head = self._live_head(lane)
            if head is None:
                continue
            if head.sort_key != key:  # the head it was filed under was cancelled: refile in its place
                heapq.heappush(self._heads, (head.sort_key, lane))
                continue
            if not eligible(lane[0], head.cost):
                skipped.append((head.sort_key, lane))
                continue
            self._lanes[lane].popleft()
            head.cancelled = True  # popped: a later cancel() is a no-op
            self._per_tenant[head.tenant] -= 1
            self._size -= 1
            self._vtime = max(self._vtime, head.start)
            found = head
            nxt = self._live_head(lane)
            if nxt is not None:
                skipped.append((nxt.sort_key, lane))
            break
        for item in skipped:
            heapq.heappush(self._heads, item)
        return found


class FairScheduler:
    """Dispatch slots over a FairQueue, keeping `reserved` slots for tenants with little in flight.

    Slots are not preemptible, so fair order alone would make a newcomer wait for a running request
    to end. A request takes as many slots as it opens streams (prompts x n). A tenant that would hold
    fewer than `small` slots with the request started (default: a quarter of the reserve) may start
    from the reserve, overshooting the shared slots by at most `small` streams; any other request
    starts only when it fits whole in the shared slots (free slots beyond the reserve). The reserve
    outlives a cut: when adaptive capacity (capacity.py) drops `capacity` below what is running,
    tenants with little in flight still start while what they hold together is below `reserved`, so
    the excess over `capacity` stays bounded and a quiet tenant never waits for a flood to drain.
    """

    def __init__(self, capacity: int, reserved: int, queue: FairQueue, small: int | None = None) -> None:
        self.capacity, self.reserved, self.queue = capacity, min(reserved, max(0, capacity - 1)), queue
        self.ceiling = capacity  # as configured; `capacity` may be cut below it (capacity.py)
        self.small = max(1, self.reserved // 4) if small is None else small
        self.running: Counter[str] = Counter()
        self.total_running = 0  # sum(running.values()), kept as it changes: it is read on every pop

    def _held_by_small(self) -> int:
        """Slots held by tenants with little in flight (what of the reserve is in use)."""
        return sum(n for n in self.running.values() if n < self.small)

    def _eligible(self, tenant: str, cost: int = 1) -> bool:
        free = self.capacity - self.total_running
        if self.running[tenant] + cost <= self.small:  # a tenant with little in flight: the reserve
            return free > 0 or self._held_by_small() < self.reserved
        if free - cost >= self.reserved:  # a big tenant's request: whole, in the shared slots
            return True
        # One that could not fit even in the whole uncut gateway starts once no big tenant runs.
        return (cost + self.reserved > self.ceiling and free > self.reserved
                and self.total_running == self._held_by_small())

    def next(self) -> tuple[str, Any] | None:
        """The next request to start now, if any may start; the caller must call done(tenant) later.

        In fair order, a big tenant's request that does not fit yet holds back the big requests
        behind it (head-of-line, for the shared slots only): otherwise single-stream requests would
        take every shared slot that frees and a 64-stream request would wait for ever.
        """
        if self.total_running >= self.capacity and self._held_by_small() >= self.reserved:
            return None
        waiting_big = False

        def eligible(tenant: str, cost: int) -> bool:
            nonlocal waiting_big
            big = self.running[tenant] + cost > self.small
            if big and waiting_big:
                return False
            ok = self._eligible(tenant, cost)
            waiting_big = waiting_big or (big and not ok)
            return ok

        entry = self.queue.pop_entry(eligible)
        if entry is None:
            return None
        self.running[entry.tenant] += entry.cost
        self.total_running += entry.cost
        return entry.tenant, entry.item

    def done(self, tenant: str, cost: int = 1) -> None:
        taken = max(1, int(cost))
        self.running[tenant] -= taken
        self.total_running -= taken
        if self.running[tenant] <= 0:
            self.total_running -= self.running[tenant]  # never below what the tenant still holds
            del self.running[tenant]
