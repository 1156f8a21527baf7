"""How long the gateway takes to hear a worker's answer: a congestion signal the event loop cannot see.

Every `interval_s` a probe sends the cheapest RPC (`Status`) to the next ready worker, on channels of
its own created on the loop that probes, and times the round trip through the same path as every
chunk (gRPC's core, its completion-queue thread, the loop). As LEDBAT (RFC 6817) does, each worker's
smallest round trip in the last `base_window_s` is its base, and what lies above it is queueing in the
gateway, reported to the observers (capacity.py). An error status is an answer too; a timeout reports
the timeout. The probe never judges a worker; it closes its channel to a worker that refused the
connection or left the registry. While its owner says nothing is in flight that a late probe could
shed (`busy_when`), it probes only every `idle_interval_s`, enough to keep each worker's base fresh:
20 round trips a second on an idle gateway cost it and the workers CPU that every request then
competed with on a small machine (docs/retrieval.md "Hop by hop"). Why: docs/gateway.md "Adaptive slots".
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import grpc

from api.gateway.grpc_client import WorkerClients
from api.gateway.registry import WorkerRegistry
from protocol.rpc import worker_pb2

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ProbePolicy:
    interval_s: float = 0.05
    idle_interval_s: float = 1.0  # while not busy (DeliveryProbe.busy_when): a sample keeps the base fresh
    timeout_s: float = 1.0
    base_window_s: float = 30.0  # the base round trip is the minimum over this long
    base_bucket_s: float = 2.0  # kept as per-bucket minima (LEDBAT's base-delay history)


class BaseDelay:
    """The minimum round trip over a sliding window, kept as per-bucket minima."""

    def __init__(self, policy: ProbePolicy) -> None:
        self.policy = policy
        self._buckets: deque[tuple[float, float]] = deque()  # (bucket start, min rtt in it)

    def add(self, now: float, rtt: float) -> float:
        """Record `rtt` at `now`; returns the base (the window's minimum, this sample included)."""
        if self._buckets and now - self._buckets[-1][0] < self.policy.base_bucket_s:
            start, low = self._buckets[-1]
            self._buckets[-1] = (start, min(low, rtt))
        else:
            self._buckets.append((now, rtt))
        while self._buckets and now - self._buckets[0][0] > self.policy.base_window_s:
            self._buckets.popleft()
        return min(low for _, low in self._buckets)


def _always() -> bool:
    return True


class DeliveryProbe:
    def __init__(self, registry: WorkerRegistry, clients: WorkerClients, policy: ProbePolicy = ProbePolicy()) -> None:
        self.registry, self.clients, self.policy = registry, clients, policy
        # Per worker (each has its own network path): its channel's key and its base round trip.
        self._bases: dict[str, tuple[tuple[str, str], BaseDelay]] = {}
        self._observers: list[Callable[[float], None]] = []
        self._next = 0
        self._task: asyncio.Task[None] | None = None
        self._busy: Callable[[], bool] = _always

    def on_delay(self, observer: Callable[[float], None]) -> None:
        """Call `observer(queueing_delay_s)` after every probe."""
        self._observers.append(observer)

    def busy_when(self, busy: Callable[[], bool]) -> None:
        """Probe every `interval_s` only while `busy()` (a late probe then has something to shed),
        otherwise every `idle_interval_s`; without it, always every `interval_s`."""
        self._busy = busy

    def start(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        """Stop probing and close the probe's channels (idempotent)."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            if task.get_loop() is asyncio.get_running_loop():  # a probe of another (finished) loop: cancelled only
                with contextlib.suppress(asyncio.CancelledError):
                    await task
                await self.clients.close()

    async def _run(self) -> None:
        last = float("-inf")
        while True:
            # Ticking costs a timer a turn; what the idle gateway saves is the round trip (both ends' CPU).
            await asyncio.sleep(self.policy.interval_s)
            now = time.monotonic()
            if now - last < self.policy.idle_interval_s and not self._busy():
                continue
            last = now
            try:
                await self.probe_once()
            except Exception:  # the probe must never stop: log and go on
                log.exception("delivery probe failed")

    async def probe_once(self) -> float | None:
        """One round trip to the next ready worker; returns the queueing delay (None: no worker, or
        no connection to it)."""
        workers = [w for w in self.registry.workers.values() if self.registry.alive(w) and self.registry.routable(w)]
        if not workers:
            return None
        worker = workers[self._next % len(workers)]
        self._next += 1
        started = time.monotonic()
        try:
            await self.clients.stub(worker.grpc_address, worker.tls_cert).Status(
                worker_pb2.StatusRequest(), timeout=self.policy.timeout_s)
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.UNAVAILABLE:
                await self.clients.forget(worker.grpc_address, worker.tls_cert)  # as a request's call does
                return None  # no connection (the registry's health checks judge that): no sample
            # An error status came back over the same path: its round trip counts like an answer's.
            timed_out = exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            rtt = self.policy.timeout_s if timed_out else time.monotonic() - started
        else:
            rtt = time.monotonic() - started
        _, base = self._bases.setdefault(worker.worker_id, ((worker.grpc_address, worker.tls_cert),
                                                            BaseDelay(self.policy)))
        delay = max(0.0, rtt - base.add(time.monotonic(), rtt))
        gone = set(self._bases) - set(self.registry.workers)
        if gone:
            live = {(w.grpc_address, w.tls_cert) for w in self.registry.workers.values()}
            for worker_id in gone:
                channel, _ = self._bases.pop(worker_id)
                if channel not in live:  # a restarted worker may reuse the address and certificate
                    await self.clients.forget(*channel)
        for observer in self._observers:
            observer(delay)
        return delay
