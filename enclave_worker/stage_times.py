"""When one choice's stages happened inside the worker, and the spans made of them afterwards.

The engine runs in its own thread; it only stamps the moment a request gets its first batch slot
(``RequestOutput.scheduled_at``). The pipeline stamps submission and first output; the servicer
turns the stamps into ``worker.queue``, ``worker.prefill`` and ``worker.decode`` once the answer
ends, so tracing adds nothing per token. Only made when tracing is on.

Sealed mode: the stage spans carry no attribute at all (their timing is what the gateway already
sees as time to first chunk and stream length); plaintext: token counts and the finish reason.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from protocol.tracing import Tracing
from protocol.tracing.attributes import Value
from protocol.tracing.noop import Parent


@dataclass
class StageTimes:
    submitted: float | None = None  # handed to the engine
    scheduled: float | None = None  # first batch slot (None: the engine does not say)
    first: float | None = None  # first output: prefill done, first token sampled


def record_stages(tracing: Tracing, parent: Parent, times: StageTimes, progress: tuple[int, int] | None,
                  *, sealed: bool) -> None:
    """The stage spans under ``parent`` (the RPC's server span); nothing if the engine never ran."""
    ended = time.monotonic()
    if times.submitted is None:
        return
    first = times.first if times.first is not None else ended
    prefill: dict[str, Value] = {}
    decode: dict[str, Value] = {}
    if not sealed and progress is not None:
        prefill["gen_ai.usage.input_tokens"] = progress[0]
        decode["gen_ai.usage.output_tokens"] = progress[1]
    start = times.submitted
    if times.scheduled is not None and times.submitted <= times.scheduled <= first:
        tracing.record("worker.queue", parent, times.submitted, times.scheduled)
        start = times.scheduled
    elif not sealed:
        prefill["sealed.queue_included"] = True
    tracing.record("worker.prefill", parent, start, first, prefill)
    if times.first is not None:
        tracing.record("worker.decode", parent, times.first, ended, decode)
