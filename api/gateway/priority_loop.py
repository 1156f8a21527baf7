"""An asyncio event loop that runs the callbacks of light tenants' requests first.

Two ready queues: callbacks whose context marks them `urgent` (the tasks of a request from a tenant
with little in flight, `mark_urgent`, by the scheduler's own rule `FairScheduler.small`; and a new
connection's accept and reads) run before the others, which keep their FIFO order. A turn still
runs as many callbacks as were ready when it began.

The gateway's only use of asyncio internals (the `_ready` deque and `_start_serving`), kept because
it was measured to be needed, with a FIFO fallback (a warning; the gateway still starts) on a
Python whose loop has no such deque. Why and the figures: docs/gateway.md "A light tenant's work
runs first in each loop turn". uvloop (`--loop uvloop`) has no such hook and runs in FIFO order.
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
        """Listening sockets accept in an urgent context: a new connection's set-up, reads and first
        steps run ahead of relaying until its request's tenant is known (the admission gate and the
        request's lifecycle mark it then)."""
        urgent = contextvars.copy_context()
        urgent.run(URGENT.set, True)
        urgent.run(super()._start_serving, *args, **kwargs)  # type: ignore[misc]  # its reader copies this context
