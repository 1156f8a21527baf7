"""The one thread a CPU model is built on and then stepped on.

Built on one thread and stepped on another, a model ran measurably slower than with both on one
thread (docs/benchmarks-history.md, "Figures moved from engine docstrings"). Two threads that each
ran torch's parallel ops leave two OpenMP teams and two malloc arenas behind; on two cores they
compete with the steps. So the engine builds its model on the thread that later runs its step loop:
`call` runs the build there and returns its result, `start` hands over the loop. No torch import:
the vLLM adapter shares the engine thread module.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

T = TypeVar("T")


class ComputeThread:
    """A daemon thread that runs submitted calls in order until closed."""

    def __init__(self, name: str) -> None:
        self._calls: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]] | None] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()

    def call(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` on the thread and return its result (or raise its exception) here."""
        return self.start(fn).result()

    def start(self, fn: Callable[[], T]) -> Future[T]:
        """Queue ``fn`` on the thread; its future completes when it has run."""
        done: Future[T] = Future()
        self._calls.put((fn, done))
        return done

    def close(self) -> None:
        """The thread ends after the calls queued before this one."""
        self._calls.put(None)

    def _run(self) -> None:
        while (item := self._calls.get()) is not None:
            fn, done = item
            del item
            try:
                done.set_result(fn())
            except BaseException as exc:  # handed to the caller, who decides
                done.set_exception(exc)
            # While the thread waits for the next call it must not hold this one: the future holds the
            # built engine and the call its checkpoint, which would then never be freed.
            del fn, done


async def on_a_passing_thread(fn: Callable[[], T], name: str) -> T:
    """Run ``fn`` on a new thread that ends when it returns, and await its result.

    For the worker's boot (decrypting the package fills a buffer with torch's parallel ops): the OpenMP
    team a thread starts lives as long as that thread, and one left behind by asyncio's pool thread
    made libgomp count more OpenMP threads than CPUs, so the stepping thread's team slept at every
    barrier instead of spinning (each parallel region then paid a futex wake-up). Ended with its
    thread, only the stepping thread's team is left."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[T] = loop.create_future()

    def settle(outcome: tuple[bool, Any]) -> None:
        if done.done():  # the awaiting task was cancelled meanwhile
            return
        ok, value = outcome
        if ok:
            done.set_result(value)
        else:
            done.set_exception(value)

    def run() -> None:
        try:
            outcome: tuple[bool, Any] = (True, fn())
        except BaseException as exc:  # handed to the awaiting task, which decides
            outcome = (False, exc)
        with contextlib.suppress(RuntimeError):  # the loop has closed: nobody waits for the outcome
            loop.call_soon_threadsafe(settle, outcome)

    threading.Thread(target=run, name=name, daemon=True).start()
    return await done
