"""Sampling parameters: one contract for every hop, and one rule for the max_tokens default.

`SamplingParams` is what a request asks the engine to do. The gateway's OpenAI layer builds it
from the client's request (protocol/openai/runner.py), it travels as the gRPC `SamplingParams`
message (protocol/rpc/sampling.py converts, both ways), and the worker hands it to the engine
unchanged (`enclave_worker.engine` re-exports this class). Each hop validates the same way because
it is the same class.

The max_tokens default, for requests that name none (`resolve_max_tokens`):

- chat completions: the gateway's `default_max_tokens` setting, which is DEFAULT_MAX_TOKENS (256)
  unless the operator sets another; sealed mode (the OpenAI layer inside the worker) uses
  DEFAULT_MAX_TOKENS. OpenAI's own chat default is "up to the context length", which would let
  one request reserve a whole token budget; 256 keeps the admission estimate honest.
- legacy completions (/v1/completions): OpenAI's documented 16, so clients written for that API
  get the answer length they expect.
- the gRPC message always carries the number the gateway chose; a message without one (0, e.g. a
  hand-written gRPC client) gets DEFAULT_MAX_TOKENS, as does the engine's `SamplingParams()`.

The engine caps max_tokens at what the model's context leaves after the prompt.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

DEFAULT_MAX_TOKENS = 256
COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's documented default for /v1/completions

Endpoint = Literal["chat", "completions"]


class InvalidSamplingParams(ValueError):
    """A sampling parameter outside its range; the request is refused, the engine keeps serving."""


def resolve_max_tokens(requested: int | None, endpoint: Endpoint, chat_default: int = DEFAULT_MAX_TOKENS) -> int:
    """The one rule (module docstring): what the client asked for, else the endpoint's default."""
    if requested:
        return requested
    return COMPLETIONS_DEFAULT_MAX_TOKENS if endpoint == "completions" else chat_default


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = DEFAULT_MAX_TOKENS
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    logprobs: int | None = None  # number of top alternatives returned with each sampled token
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        def bad(msg: str) -> None:
            raise InvalidSamplingParams(msg)

        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            bad("max_tokens must be an integer >= 1")
        if not isinstance(self.temperature, int | float) or not math.isfinite(self.temperature) or self.temperature < 0:
            bad("temperature must be a finite number >= 0")
        if not isinstance(self.top_p, int | float) or not (0 < self.top_p <= 1):
            bad("top_p must be in (0, 1]")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            bad("top_k must be an integer >= 0 (0 = off)")
        if self.seed is not None and not isinstance(self.seed, int):
            bad("seed must be an integer")
        if isinstance(self.stop, str) or not all(isinstance(s, str) and s for s in self.stop):
            bad("stop must be a tuple of non-empty strings")
        if not all(isinstance(t, int) and t >= 0 for t in self.stop_token_ids):
            bad("stop_token_ids must be non-negative integers")
        if self.logprobs is not None and (not isinstance(self.logprobs, int) or not 0 <= self.logprobs <= 20):
            bad("logprobs must be an integer in [0, 20]")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0
