"""Sampling: greedy, temperature, top-k, top-p with per-request generators; logprobs with alternatives."""

from __future__ import annotations

import torch

from ..config import SamplingParams, TokenLogprob


def _filter(logits: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    logits = logits / p.temperature
    if p.top_k and p.top_k < logits.shape[-1]:
        kth = torch.topk(logits, p.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if p.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        probs = sorted_logits.softmax(-1)
        drop = probs.cumsum(-1) - probs > p.top_p  # keep the smallest prefix with mass >= top_p
        logits = logits.masked_fill(torch.zeros_like(drop).scatter(0, order, drop), float("-inf"))
    return logits


def sample(
    logits: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator | None]
) -> tuple[list[int], list[TokenLogprob | None]]:
    """logits: [B, V] float32. Returns the next token and its logprob record (if asked) per row."""
    greedy = logits.argmax(dim=-1).tolist()
    tokens: list[int] = []
    for i, p in enumerate(params):
        if p.greedy:
            tokens.append(greedy[i])
            continue
        probs = _filter(logits[i], p).softmax(-1)
        tokens.append(int(torch.multinomial(probs, 1, generator=generators[i]).item()))
    records: list[TokenLogprob | None] = [None] * len(params)
    rows = [i for i, p in enumerate(params) if p.logprobs is not None]
    if rows:
        logp = torch.log_softmax(logits[rows], dim=-1)
        for j, i in enumerate(rows):
            k = params[i].logprobs
            top = torch.topk(logp[j], k) if k else None
            alts = tuple(zip(top.indices.tolist(), top.values.tolist(), strict=True)) if top is not None else ()
            records[i] = TokenLogprob(tokens[i], float(logp[j, tokens[i]]), alts)
    return tokens, records
