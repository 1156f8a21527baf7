"""Rotary position embedding (HF rotate-half layout) with a precomputed cos/sin table: plain, Llama 3
(``llama3``), linear and Phi-3's ``longrope`` frequencies, over the whole head or its leading part
(``partial_rotary_factor``)."""

from __future__ import annotations

import math
from typing import Any

import torch


def _kind(scaling: dict[str, Any] | None) -> str | None:
    return scaling.get("rope_type", scaling.get("type")) if scaling else None


def _inv_freq(head_dim: int, theta: float, scaling: dict[str, Any] | None) -> torch.Tensor:
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    if scaling and _kind(scaling) == "linear":
        inv = inv / float(scaling["factor"])
    if scaling and _kind(scaling) == "llama3":
        factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
        old_len = scaling["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv
        smooth = (old_len / wavelen - low) / (high - low)
        scaled = torch.where(wavelen > old_len / low, inv / factor, inv)
        mid = (1 - smooth) * scaled / factor + smooth * scaled
        is_mid = (wavelen >= old_len / high) & (wavelen <= old_len / low)
        inv = torch.where(is_mid, mid, scaled)
    return inv


def _longrope(rotary_dim: int, max_positions: int, theta: float,
              scaling: dict[str, Any]) -> tuple[torch.Tensor, float]:
    """Phi-3's frequencies per position: ``short_factor`` below ``original_max_position_embeddings``,
    ``long_factor`` from there on (what HF's generation does once a sequence passes it: the cached keys
    keep the rotation they were written with), and the attention factor both are scaled by."""
    original = int(scaling["original_max_position_embeddings"])
    factor = scaling.get("factor") or (float(scaling.get("max_position_embeddings") or original) / original)
    attention = scaling.get("attention_factor")
    if attention is None:
        attention = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
    base = theta ** (torch.arange(0, rotary_dim, 2, dtype=torch.int64).float() / rotary_dim)
    positions = torch.arange(max_positions, dtype=torch.float32)[:, None]
    short = positions * (1.0 / (torch.tensor(scaling["short_factor"], dtype=torch.float32) * base))[None, :]
    long = positions * (1.0 / (torch.tensor(scaling["long_factor"], dtype=torch.float32) * base))[None, :]
    return torch.where(positions < original, short, long), float(attention)


class RotaryEmbedding(torch.nn.Module):
    def __init__(
        self,
        head_dim: int,
        max_positions: int,
        theta: float,
        scaling: dict[str, Any] | None = None,
        device: str = "cpu",
        rotary_dim: int | None = None,
    ) -> None:
        """``rotary_dim``: rotate only each head's first ``rotary_dim`` values (default: all of them)."""
        super().__init__()
        rotary_dim = rotary_dim or head_dim
        if scaling and _kind(scaling) == "longrope":
            freqs, attention = _longrope(rotary_dim, max_positions, theta, scaling)
        else:
            inv = _inv_freq(rotary_dim, theta, scaling)
            freqs, attention = torch.arange(max_positions, dtype=torch.float32)[:, None] * inv[None, :], 1.0
        cos, sin = freqs.cos() * attention, freqs.sin() * attention
        # Full-width tables so one rotation is x * cos + roll(x) * sin_signed: roll(x, half) is
        # [x2, x1] and sin_signed is [-sin, sin], which gives HF's [x1 cos - x2 sin, x2 cos + x1 sin].
        self.cos = torch.cat((cos, cos), dim=-1).to(device)  # [max_positions, head_dim]
        self.sin_signed = torch.cat((-sin, sin), dim=-1).to(device)
        self.half_dim = rotary_dim // 2  # not `half`: that is nn.Module.half(), the dtype conversion
        self.rotary_dim, self.head_dim = rotary_dim, head_dim

    def lookup(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and signed sin rows for these positions, [tokens, 1, head_dim]; shared by every layer."""
        return self.cos[positions][:, None, :], self.sin_signed[positions][:, None, :]

    def half_lookup(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin of these positions, [tokens, head_dim / 2] float32 (the fused kernel's layout)."""
        return self.cos[positions, : self.half_dim], self.sin_signed[positions, self.half_dim :]

    def forward(self, table: tuple[torch.Tensor, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        """x: [tokens, heads, head_dim]; rotated in float32, returned in x's dtype."""
        cos, sin = table
        if self.rotary_dim != x.shape[-1]:  # partial: the rest of each head passes unrotated
            part = self.forward(table, x[..., : self.rotary_dim].contiguous())
            return torch.cat((part, x[..., self.rotary_dim :]), dim=-1)
        xf = x.float()
        return torch.addcmul(xf * cos, torch.roll(xf, self.half_dim, -1), sin).to(x.dtype)
