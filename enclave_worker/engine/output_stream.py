"""One request's outputs, from an engine thread to the asyncio side, for both engines (ours and
vLLM's adapter): the engine thread calls `sink` with each RequestOutput (or the exception that
ended the request); the caller iterates. Closing the iterator early aborts the request."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Callable

from enclave_worker.engine.config import RequestOutput

Sink = Callable[[RequestOutput | BaseException], None]


async def stream_request(start: Callable[[Sink], None], abort: Callable[[], None]
                         ) -> AsyncGenerator[RequestOutput, None]:
    """`start(sink)` submits the request (on first iteration, so a refusal raises there); `abort()`
    runs if the consumer stops before the request finished."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[RequestOutput | BaseException] = asyncio.Queue()

    def sink(item: RequestOutput | BaseException) -> None:
        loop.call_soon_threadsafe(queue.put_nowait, item)

    start(sink)
    finished, pending = False, None
    try:
        while True:
            item = pending or await queue.get()
            pending = None
            # A consumer that fell behind gets what piled up as one delta (as vLLM's output
            # collector does): one message per step through gRPC and the gateway, not per token.
            while not isinstance(item, BaseException) and not item.finished and not queue.empty():
                later = queue.get_nowait()
                if isinstance(later, BaseException):
                    pending = later
                    break
                item = item.merged(later)
            if isinstance(item, BaseException):
                finished = True
                raise item
            finished = item.finished
            yield item
            if finished:
                return
    finally:
        if not finished:
            abort()
