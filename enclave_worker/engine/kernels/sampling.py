"""Batched sampling on the device: greedy, temperature, top-k and top-p for every row at once, with
no host round trip per sequence. The caller reads the sampled tokens back in one copy.

Sampling uses the exponential race (argmax of p / E, E ~ Exp(1)), which draws exactly from p and
needs no cumulative search; rows with a seed draw their noise from their own generator.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class BatchSampling:
    """Per-row parameters as device tensors, built once per step from the requests' SamplingParams."""

    temperature: torch.Tensor  # [B] float32; 0 means greedy
    top_k: torch.Tensor  # [B] int64; 0 means off
    top_p: torch.Tensor  # [B] float32; 1 means off
    min_p: torch.Tensor | None = None  # [B] float32; 0 means off; None: off for every row

    @classmethod
    def from_lists(cls, temperature: list[float], top_k: list[int], top_p: list[float],
                   device: torch.device | str) -> BatchSampling:
        return cls(torch.tensor(temperature, dtype=torch.float32, device=device),
                   torch.tensor(top_k, dtype=torch.int64, device=device),
                   torch.tensor(top_p, dtype=torch.float32, device=device))


def filtered_probs(logits: torch.Tensor, params: BatchSampling) -> torch.Tensor:
    """Softmax of temperature-scaled logits with min-p, top-k and top-p applied per row, [B, V] float32."""
    vocab = logits.shape[-1]
    temp = torch.where(params.temperature > 0, params.temperature, torch.ones_like(params.temperature))
    scaled = logits.float() / temp[:, None]
    if params.min_p is not None:  # after temperature, before top-k / top-p, as vLLM does
        probs = scaled.softmax(-1)
        scaled = scaled.masked_fill(probs < probs.amax(-1, keepdim=True) * params.min_p[:, None], float("-inf"))
    sorted_logits, order = scaled.sort(dim=-1, descending=True)
    rank = torch.arange(vocab, device=logits.device)[None, :]
    k = torch.where(params.top_k > 0, params.top_k, torch.full_like(params.top_k, vocab))
    drop = rank >= k[:, None]
    probs = sorted_logits.masked_fill(drop, float("-inf")).softmax(-1)
    drop |= probs.cumsum(-1) - probs > params.top_p[:, None]  # keep the smallest prefix with mass >= top_p
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.empty_like(scaled).scatter_(1, order, sorted_logits).softmax(-1)


def sample_on_device(logits: torch.Tensor, params: BatchSampling,
                     generators: list[torch.Generator | None]) -> torch.Tensor:
    """Next token per row as a [B] int64 device tensor (no host synchronisation)."""
    greedy = logits.argmax(dim=-1)
    probs = filtered_probs(logits, params)
    noise = torch.empty_like(probs).exponential_()
    for row, generator in enumerate(generators):
        if generator is not None:  # a seeded request keeps its own stream
            noise[row].exponential_(generator=generator)
    drawn = (probs / noise).argmax(dim=-1)
    return torch.where(params.temperature > 0, drawn, greedy)
