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
MAX_LOGIT_BIAS = 300  # OpenAI's own cap on logit_bias entries
MAX_REPETITION_PENALTY = 100.0  # far above any useful value; keeps the scaled logits finite

Endpoint = Literal["chat", "completions"]


class InvalidSamplingParams(ValueError):
    """A sampling parameter outside its range; the request is refused, the engine keeps serving."""


def resolve_max_tokens(requested: int | None, endpoint: Endpoint, chat_default: int = DEFAULT_MAX_TOKENS) -> int:
    """The one rule (module docstring): what the client asked for, else the endpoint's default."""
    if requested:
        return requested
    return COMPLETIONS_DEFAULT_MAX_TOKENS if endpoint == "completions" else chat_default


STRUCTURED_KINDS = ("json_schema", "regex", "lark")
MAX_STRUCTURED_SPEC = 64 * 1024  # characters of a schema or grammar


@dataclass(frozen=True)
class StructuredOutput:
    """Constrained decoding: every answer matches `spec`, enforced token by token in the worker's
    engine. `json_schema`: a JSON Schema document (JSON text); `regex`; `lark`: a grammar in
    llguidance's Lark dialect (tool calls: protocol/openai/constraints.py builds it)."""

    kind: str
    spec: str

    def __post_init__(self) -> None:
        if self.kind not in STRUCTURED_KINDS:
            raise InvalidSamplingParams(f"structured output kind must be one of {STRUCTURED_KINDS}")
        if not isinstance(self.spec, str) or not self.spec or len(self.spec) > MAX_STRUCTURED_SPEC:
            raise InvalidSamplingParams(f"a structured output spec is a non-empty string of at most "
                                        f"{MAX_STRUCTURED_SPEC} characters")


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
    # vLLM's semantics (enclave_worker/engine/layers/logits_processors.py): OpenAI's additive penalties
    # on the output so far, vLLM's multiplicative repetition penalty on prompt and output, per-token
    # additive biases (token id, bias), and min-p relative to the most likely token after temperature.
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0  # 1 = off
    logit_bias: tuple[tuple[int, float], ...] = ()
    min_p: float = 0.0  # 0 = off
    structured: StructuredOutput | None = None

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
        for name in ("presence_penalty", "frequency_penalty"):
            v = getattr(self, name)
            if not isinstance(v, int | float) or not -2 <= v <= 2:
                bad(f"{name} must be a number in [-2, 2]")
        rp = self.repetition_penalty
        if not isinstance(rp, int | float) or not math.isfinite(rp) or not 0 < rp <= MAX_REPETITION_PENALTY:
            bad(f"repetition_penalty must be a number in (0, {MAX_REPETITION_PENALTY}]")
        if not isinstance(self.min_p, int | float) or not 0 <= self.min_p <= 1:
            bad("min_p must be a number in [0, 1]")
        if not isinstance(self.logit_bias, tuple) or len(self.logit_bias) > MAX_LOGIT_BIAS:
            bad(f"logit_bias takes at most {MAX_LOGIT_BIAS} tokens")
        ids = [t for t, _ in self.logit_bias]
        if len(set(ids)) != len(ids) or not all(
                isinstance(t, int) and t >= 0 and isinstance(b, int | float) and -100 <= b <= 100
                for t, b in self.logit_bias):
            bad("logit_bias maps distinct token ids >= 0 to biases in [-100, 100]")
        if self.structured is not None and not isinstance(self.structured, StructuredOutput):
            bad("structured must be a StructuredOutput")

    @property
    def penalized(self) -> bool:
        """Whether any of the three penalties is on (they need the sequence's token counts)."""
        return bool(self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1.0)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0
