"""An asyncio event loop that runs the callbacks of light tenants' requests first.

Fair queueing (fairqueue.py) decides who gets a dispatch slot, and the reserve means a tenant with
little in flight gets one at once. After that every request's work shares one event loop, which
runs its ready callbacks in FIFO order: under `sealed bench flood` a quiet tenant's chunk, arrived
from its worker, waited behind hundreds of callbacks relaying a flooding tenant's 64 streams and a
bulk tenant's hundreds (each loop turn up to the lag target, several turns per request). This loop
keeps two ready queues: callbacks whose context marks them `urgent` (the tasks of a request from a
tenant with little in flight, `mark_urgent`) run before the others; the others keep their order.
A turn still runs as many callbacks as were ready when it began, so the others wait only for as
much urgent work as there is, and that is bounded: which tenant counts as light is the scheduler's
own rule (fairqueue.py, `small`, a quarter of the reserve), so urgent requests hold few streams.

It is asyncio's selector loop with its ready queue replaced (`_ready`, a private attribute that
CPython's base loop uses in four places: append, popleft, len, clear), and with its listening
sockets' accept callbacks created in an urgent context (`_start_serving`). This module is the only
place the gateway touches asyncio's internals, and it is kept because it was measured to be needed
(docs/benchmarks-history.md: without it a quiet tenant's loaded TTFT p99 reached 3.98x its unloaded
value, with it at most 1.28x; target 2x). It falls back, with a warning, to asyncio's own FIFO order
on a Python whose loop has no such `_ready` deque, or whose handles carry no context: the gateway
then starts and serves as on uvloop (`--loop uvloop`), which has no such hook either.
"""

from __future__ import annotations

import asyncio
import collections
import contextvars
import logging
from contextvars import ContextVar
from typing import Any

log = logging.getLogger(__name__)
URGENT: ContextVar[bool] = ContextVar("sealed_gateway_urgent", default=False)


def mark_urgent(urgent: bool) -> None:
    """Mark the current task (and the tasks and callbacks it schedules from now on) urgent or not."""
    if URGENT.get() != urgent:
        URGENT.set(urgent)


class TwoLevelReadyQueue:
    """The loop's ready queue: urgent handles first, each level in FIFO order."""

    __slots__ = ("normal", "urgent")

    def __init__(self) -> None:
        self.urgent: collections.deque[asyncio.Handle] = collections.deque()
        self.normal: collections.deque[asyncio.Handle] = collections.deque()

    def append(self, handle: asyncio.Handle) -> None:
        context = getattr(handle, "_context", None)  # the context the callback runs in
        if isinstance(context, contextvars.Context) and context.get(URGENT, False):
            self.urgent.append(handle)
        else:
            self.normal.append(handle)

    def popleft(self) -> asyncio.Handle:
        return self.urgent.popleft() if self.urgent else self.normal.popleft()

    def clear(self) -> None:
        self.urgent.clear()
        self.normal.clear()

    def __len__(self) -> int:
        return len(self.urgent) + len(self.normal)

    def __bool__(self) -> bool:
        return bool(self.urgent) or bool(self.normal)


class PriorityEventLoop(asyncio.SelectorEventLoop):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        ready = getattr(self, "_ready", None)
        self.prioritised = isinstance(ready, collections.deque) and not ready
        if self.prioritised:
            self._ready = TwoLevelReadyQueue()
        else:  # a Python whose loop is built otherwise: serve in asyncio's own FIFO order
            log.warning("this Python's event loop has no `_ready` deque to replace: light tenants' callbacks "
                        "are not run first (fair queueing and the reserve still hold)")

    def _start_serving(self, *args: Any, **kwargs: Any) -> None:
        """Listening sockets accept in an urgent context, so a new connection's set-up, its reads and
        its requests' first steps run ahead of relaying until the request's tenant is known (the
        admission gate and the request's lifecycle mark it then). Under `sealed bench flood` at twice the token rate,
        a quiet tenant's first request on a new connection took 44 ms against 13-20 ms for the next
        ones: the accept, the first read and the parse waited their FIFO turns behind relaying."""
        urgent = contextvars.copy_context()
        urgent.run(URGENT.set, True)
        urgent.run(super()._start_serving, *args, **kwargs)  # type: ignore[misc]  # its reader copies this context
