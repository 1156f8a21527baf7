"""What the OpenAI layer needs from whoever runs the choices: the gateway (workers over gRPC) or
the worker itself (its engine, in sealed mode)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from protocol.openai.errors import OpenAIError
from protocol.openai.schemas import SamplingFields
from protocol.rpc import worker_pb2
from protocol.rpc.sampling import to_wire
from protocol.sampling import InvalidSamplingParams, SamplingParams


@dataclass
class ChoiceResult:
    text: str = ""
    finish_reason: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    logprobs: list[worker_pb2.TokenLogprob] = field(default_factory=list)


Streams = list[AsyncIterator[worker_pb2.GenerateChunk]]


class ChoiceRunner(Protocol):
    async def collect(self, streams: Streams) -> list[ChoiceResult]: ...

    def merged(self, streams: Streams) -> AsyncIterator[tuple[int, worker_pb2.GenerateChunk]]: ...

    async def close(self) -> None: ...


def sampling_params(req: SamplingFields, max_tokens: int, logprobs: int | None, extra_stop: list[str], index: int
                    ) -> worker_pb2.SamplingParams:
    """The request's sampling fields as the one contract (protocol/sampling.py), on the wire."""
    # n > 1 with a seed: distinct yet reproducible choices (wrapping within int64, the wire type).
    seed = None if req.seed is None else (req.seed + index + (1 << 63)) % (1 << 64) - (1 << 63)
    try:
        params = SamplingParams(max_tokens=max_tokens, temperature=1.0 if req.temperature is None else req.temperature,
                                top_p=1.0 if req.top_p is None else req.top_p, seed=seed,
                                stop=tuple(req.stop_list() + extra_stop), logprobs=logprobs,
                                ignore_eos=req.ignore_eos)
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
