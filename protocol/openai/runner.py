"""What the OpenAI layer needs from whoever runs the choices: the gateway (workers over gRPC) or
the worker itself (its engine, in sealed mode)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from protocol.openai.errors import OpenAIError
from protocol.openai.schemas import SamplingFields
from protocol.rpc import worker_pb2
from protocol.rpc.sampling import to_wire
from protocol.sampling import InvalidSamplingParams, SamplingParams, StructuredOutput


@dataclass
class ChoiceResult:
    text: str = ""
    finish_reason: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    logprobs: list[worker_pb2.TokenLogprob] = field(default_factory=list)


Streams = list[AsyncIterator[worker_pb2.GenerateChunk]]


async def collect_choice(stream: AsyncIterator[worker_pb2.GenerateChunk],
                         on_chunk: Callable[[worker_pb2.GenerateChunk], None]) -> ChoiceResult:
    """One choice's whole answer; `on_chunk` sees every chunk first (token accounting)."""
    out, parts = ChoiceResult(), []
    async for chunk in stream:
        on_chunk(chunk)
        parts.append(chunk.text)
        out.logprobs.extend(chunk.logprobs)
        out.prompt_tokens, out.completion_tokens = chunk.prompt_tokens, chunk.completion_tokens
        out.finish_reason = chunk.finish_reason or None
    out.text = "".join(parts)
    return out


async def merge_streams(streams: Streams) -> AsyncGenerator[tuple[int, worker_pb2.GenerateChunk], None]:
    """(choice index, chunk) in arrival order, one pump task per stream; a stream's error is raised
    here. Use it under `contextlib.aclosing`, so that leaving early cancels the pumps at once."""
    if len(streams) == 1:
        # One choice (nearly every request): read it in place. A pump task and its queue cost two
        # event-loop turns per token and put the task's wake-up between a token and its client.
        # Leaving early leaves the stream suspended at a yield; its owner closes it, as with pumps.
        async for c in streams[0]:
            yield 0, c
        return
    queue: asyncio.Queue[tuple[int, Any]] = asyncio.Queue()

    async def pump(i: int, s: AsyncIterator[worker_pb2.GenerateChunk]) -> None:
        try:
            async for c in s:
                await queue.put((i, c))
            await queue.put((i, None))
        except Exception as exc:
            await queue.put((i, exc))

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
    remaining = len(tasks)
    try:
        while remaining:
            i, item = await queue.get()
            if item is None:
                remaining -= 1
                continue
            if isinstance(item, Exception):
                raise item
            yield i, item
    finally:
        for t in tasks:
            t.cancel()
        # Wait for the pumps to stop: closing their streams next (the caller's cleanup) while a pump
        # still runs one raised "aclose(): asynchronous generator is already running".
        await asyncio.gather(*tasks, return_exceptions=True)


async def prepend(first: worker_pb2.GenerateChunk, rest: AsyncIterator[worker_pb2.GenerateChunk]
                  ) -> AsyncIterator[worker_pb2.GenerateChunk]:
    """A choice's stream with its first chunk (read to start it) put back in front."""
    yield first
    async for chunk in rest:  # read to the end even after the last token: metering happens there
        yield chunk


class ChoiceRunner(Protocol):
    async def collect(self, streams: Streams) -> list[ChoiceResult]: ...

    def merged(self, streams: Streams) -> AsyncIterator[tuple[int, worker_pb2.GenerateChunk]]: ...

    async def close(self) -> None: ...


def check_stream_options(req: SamplingFields) -> None:
    """`stream_options` shapes a stream: without `stream` OpenAI refuses it, and so does this server."""
    if req.stream_options is not None and not req.stream:
        raise OpenAIError(400, "stream_options is only allowed when stream is true", param="stream_options")


def sampling_params(req: SamplingFields, max_tokens: int, logprobs: int | None, extra_stop: list[str], index: int,
                    structured: StructuredOutput | None = None) -> worker_pb2.SamplingParams:
    """The request's sampling fields as the one contract (protocol/sampling.py), on the wire."""
    # n > 1 with a seed: distinct yet reproducible choices (wrapping within int64, the wire type).
    seed = None if req.seed is None else (req.seed + index + (1 << 63)) % (1 << 64) - (1 << 63)
    try:
        params = SamplingParams(max_tokens=max_tokens, temperature=1.0 if req.temperature is None else req.temperature,
                                top_p=1.0 if req.top_p is None else req.top_p, seed=seed,
                                stop=tuple(req.stop_list() + extra_stop), logprobs=logprobs,
                                ignore_eos=req.ignore_eos, presence_penalty=req.presence_penalty or 0.0,
                                frequency_penalty=req.frequency_penalty or 0.0,
                                repetition_penalty=1.0 if req.repetition_penalty is None else req.repetition_penalty,
                                min_p=req.min_p or 0.0,
                                logit_bias=tuple(sorted((int(t), b) for t, b in (req.logit_bias or {}).items())),
                                structured=structured)
    except InvalidSamplingParams as exc:
        raise OpenAIError(400, str(exc)) from None
    return to_wire(params)


def usage_of(results: list[Any]) -> dict[str, int]:
    p = max((r.prompt_tokens for r in results), default=0)
    c = sum(r.completion_tokens for r in results)
    return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}


def sse(doc: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(doc)}\n\n".encode()


class ChunkEncoder:
    """Streamed chunks of one answer: the constant part (id, model, tee, ...) is encoded once, and
    each chunk encodes only its choice: `{**base, "choices": [choice]}` as JSON, per token."""

    def __init__(self, base: dict[str, Any]) -> None:
        self._head = "data: " + json.dumps(base)[:-1] + (', "choices": [' if base else '"choices": [')

    def __call__(self, choice: dict[str, Any]) -> bytes:
        return f"{self._head}{json.dumps(choice)}]}}\n\n".encode()


SSE_DONE = b"data: [DONE]\n\n"
