"""`protocol.sampling.SamplingParams` on the gRPC wire (the `SamplingParams` message), both ways."""

from __future__ import annotations

from protocol.rpc import worker_pb2
from protocol.sampling import DEFAULT_MAX_TOKENS, SamplingParams


def to_wire(params: SamplingParams) -> worker_pb2.SamplingParams:
    p = worker_pb2.SamplingParams(max_tokens=params.max_tokens, temperature=params.temperature,
                                  top_p=params.top_p, top_k=params.top_k, stop=list(params.stop),
                                  stop_token_ids=list(params.stop_token_ids), ignore_eos=params.ignore_eos)
    if params.seed is not None:
        p.seed = params.seed
    if params.logprobs is not None:
        p.logprobs = params.logprobs
    return p


def from_wire(p: worker_pb2.SamplingParams) -> SamplingParams:
    """Unset numbers read as proto3 zeros: max_tokens 0 is the default (protocol/sampling.py), top_p
    0 is 1.0 (off); temperature 0 is greedy, as sent. Raises InvalidSamplingParams."""
    return SamplingParams(
        max_tokens=p.max_tokens or DEFAULT_MAX_TOKENS, temperature=p.temperature, top_p=p.top_p or 1.0,
        top_k=p.top_k, seed=p.seed if p.HasField("seed") else None, stop=tuple(p.stop),
        stop_token_ids=tuple(p.stop_token_ids), logprobs=p.logprobs if p.HasField("logprobs") else None,
        ignore_eos=p.ignore_eos)
