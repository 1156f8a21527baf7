"""Sampling: logit bias and penalties, greedy, temperature, min-p, top-k, top-p with per-request
generators; logprobs (of the raw logits) with alternatives. The order is vLLM's (logits_processors.py)."""

from __future__ import annotations

import torch

from ..config import SamplingParams, TokenLogprob
from .logits_processors import apply_min_p, process

# The tokens each row has seen, for the penalties: (prompt token ids, output token ids) per row.
History = tuple[list[list[int]], list[list[int]]]

# Where top-p looks for the nucleus first (see top_p_filter).
NUCLEUS_CANDIDATES = 1024


def _filter(logits: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    """Top-k then top-p on one row of temperature-scaled logits."""
    if p.top_k and p.top_k < logits.shape[-1]:
        kth = torch.topk(logits, p.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if p.top_p < 1.0:
        logits = top_p_filter(logits, p.top_p)
    return logits


def top_p_filter(logits: torch.Tensor, top_p: float, candidates: int = NUCLEUS_CANDIDATES) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose mass reaches `top_p`; the rest get -inf.

    Sorting the whole vocabulary (49,152 logits) took 2-3 ms a row on one core, per decode step of
    every sampled sequence; the nucleus nearly always lies among the few hundred most likely tokens,
    and topk finds those in 0.15 ms. Only when their mass is not above `top_p` (a flat distribution)
    is everything sorted. Above it, every token past the candidates has more than `top_p` ahead of
    it, so it is cut either way: the result is the full sort's.
    """
    k = min(candidates, logits.shape[-1])
    values, order = torch.topk(logits, k)  # most likely first
    probs = (values - torch.logsumexp(logits, -1)).exp()
    if k < logits.shape[-1] and float(probs.sum()) <= top_p:
        values, order = torch.sort(logits, descending=True)
        probs = values.softmax(-1)
    kept = order[~(probs.cumsum(-1) - probs > top_p)]  # the smallest prefix with mass >= top_p
    return torch.full_like(logits, float("-inf")).index_put_((kept,), logits[kept])


# Columns per chunk of the two-level cumulative sum in `draw`.
DRAW_CHUNK = 1024


def draw(probs: torch.Tensor, generators: list[torch.Generator | None]) -> list[int]:
    """One token per row of ``probs`` [B, V] (rows sum to 1), each row from its own generator.

    Inverse CDF: one uniform per row against the row's cumulative sum (in float64, so 49k small
    probabilities add up without drift), the first index whose sum exceeds it. torch.multinomial
    draws one exponential per vocabulary entry (its exponential race): 49,152 random numbers a row
    (docs/benchmarks-history.md, "Figures moved from engine docstrings"); this draws one. A token of
    probability zero (cut by top-k / top-p) adds nothing to the sum, so no uniform lands on it.

    The sum is taken in two levels: per chunk of DRAW_CHUNK columns (float64 accumulation), the
    chunks' running sum, then the running sum inside the one chunk the uniform falls in, instead of
    one float64 running sum over the whole row (slower: docs/benchmarks-history.md); the boundaries
    are the same sums, added in another order.
    """
    rows, vocab = probs.shape
    chunks = -(-vocab // DRAW_CHUNK)
    if chunks * DRAW_CHUNK != vocab:  # zero mass in the padding: never drawn
        probs = torch.nn.functional.pad(probs, (0, chunks * DRAW_CHUNK - vocab))
    blocks = probs.view(rows, chunks, DRAW_CHUNK)
    sums = blocks.sum(-1, dtype=torch.float64)  # [B, chunks]
    ends = sums.cumsum(-1)
    # Each row's generator lives on the engine's device (a CUDA generator draws only on CUDA).
    u = torch.stack([torch.rand((), dtype=torch.float64, generator=g, device=probs.device if g is None else g.device)
                     for g in generators]).to(probs.device)
    target = (u * ends[:, -1]).unsqueeze(-1)
    chunk = torch.searchsorted(ends, target, right=True).clamp_(max=chunks - 1)  # [B, 1]
    start = ends.gather(1, chunk) - sums.gather(1, chunk)  # the mass before the chosen chunk
    inside = blocks[torch.arange(rows, device=probs.device), chunk.squeeze(-1)].double().cumsum(-1) + start
    offset = torch.searchsorted(inside, target, right=True).clamp_(max=DRAW_CHUNK - 1)
    picked = (chunk * DRAW_CHUNK + offset).squeeze(-1)
    return picked.clamp_(max=vocab - 1).tolist()


def scaled_rows(processed: torch.Tensor, params: list[SamplingParams], rows: list[int]) -> torch.Tensor:
    """The sampled rows of the processed logits over their temperatures, min-p applied (batched)."""
    dev = processed.device
    temps = torch.tensor([params[i].temperature for i in rows], dtype=torch.float32, device=dev)
    scaled = processed[torch.tensor(rows, device=dev)].float() / temps[:, None]
    if any(params[i].min_p for i in rows):
        scaled = apply_min_p(scaled, torch.tensor([params[i].min_p for i in rows], device=dev))
    return scaled


def sample(
    logits: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator | None],
    history: History | None = None,
) -> tuple[list[int], list[TokenLogprob | None]]:
    """logits: [B, V] float32. Returns the next token and its logprob record (if asked) per row.
    ``history``: the rows' prompt and output tokens (needed only when a row has a penalty)."""
    prompts, outputs = history or ([[] for _ in params], [[] for _ in params])
    processed = process(logits, params, prompts, outputs)
    tokens: list[int] = processed.argmax(dim=-1).tolist()
    drawn = [i for i, p in enumerate(params) if not p.greedy]
    if drawn:
        scaled = scaled_rows(processed, params, drawn)
        probs = torch.stack([_filter(scaled[j], params[i]).softmax(-1) for j, i in enumerate(drawn)])
        for i, token in zip(drawn, draw(probs, [generators[i] for i in drawn]), strict=True):
            tokens[i] = token
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
