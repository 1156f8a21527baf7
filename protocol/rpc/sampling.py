"""`protocol.sampling.SamplingParams` on the gRPC wire (the `SamplingParams` message), both ways."""

from __future__ import annotations

from protocol.rpc import worker_pb2
from protocol.sampling import DEFAULT_MAX_TOKENS, SamplingParams, StructuredOutput


def to_wire(params: SamplingParams) -> worker_pb2.SamplingParams:
    p = worker_pb2.SamplingParams(max_tokens=params.max_tokens, temperature=params.temperature,
                                  top_p=params.top_p, top_k=params.top_k, stop=list(params.stop),
                                  stop_token_ids=list(params.stop_token_ids), ignore_eos=params.ignore_eos,
                                  presence_penalty=params.presence_penalty,
                                  frequency_penalty=params.frequency_penalty,
                                  repetition_penalty=params.repetition_penalty, min_p=params.min_p,
                                  logit_bias=[worker_pb2.LogitBias(token_id=t, bias=b)
                                              for t, b in sorted(params.logit_bias)])
    if params.structured is not None:
        p.structured.kind, p.structured.spec = params.structured.kind, params.structured.spec
    if params.seed is not None:
        p.seed = params.seed
    if params.logprobs is not None:
        p.logprobs = params.logprobs
    return p


def from_wire(p: worker_pb2.SamplingParams) -> SamplingParams:
    """Unset numbers read as proto3 zeros: max_tokens 0 is the default (protocol/sampling.py), top_p
    0 is 1.0 (off), repetition_penalty 0 is 1.0 (off); temperature 0 is greedy, as sent. Floats
    travel as float32, so a penalty of 0.1 arrives as 0.1 rounded to float32. Raises InvalidSamplingParams."""
    return SamplingParams(
        max_tokens=p.max_tokens or DEFAULT_MAX_TOKENS, temperature=p.temperature, top_p=p.top_p or 1.0,
        top_k=p.top_k, seed=p.seed if p.HasField("seed") else None, stop=tuple(p.stop),
        stop_token_ids=tuple(p.stop_token_ids), logprobs=p.logprobs if p.HasField("logprobs") else None,
        ignore_eos=p.ignore_eos, presence_penalty=p.presence_penalty, frequency_penalty=p.frequency_penalty,
        repetition_penalty=p.repetition_penalty or 1.0, min_p=p.min_p,
        logit_bias=tuple((b.token_id, b.bias) for b in p.logit_bias),
        structured=StructuredOutput(p.structured.kind, p.structured.spec) if p.HasField("structured") else None)
