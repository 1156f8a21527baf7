"""Rotary position embedding (HF rotate-half layout) with a precomputed cos/sin table."""

from __future__ import annotations

import math
from typing import Any

import torch


def _inv_freq(head_dim: int, theta: float, scaling: dict[str, Any] | None) -> torch.Tensor:
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    if scaling and scaling.get("rope_type", scaling.get("type")) == "llama3":
        factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
        old_len = scaling["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv
        smooth = (old_len / wavelen - low) / (high - low)
        scaled = torch.where(wavelen > old_len / low, inv / factor, inv)
        mid = (1 - smooth) * scaled / factor + smooth * scaled
        is_mid = (wavelen >= old_len / high) & (wavelen <= old_len / low)
        inv = torch.where(is_mid, mid, scaled)
    return inv


class RotaryEmbedding(torch.nn.Module):
    def __init__(
        self,
        head_dim: int,
        max_positions: int,
        theta: float,
        scaling: dict[str, Any] | None = None,
        device: str = "cpu",
    ) -> None:
        super().__init__()
        inv = _inv_freq(head_dim, theta, scaling)
        freqs = torch.arange(max_positions, dtype=torch.float32)[:, None] * inv[None, :]
        cos, sin = freqs.cos(), freqs.sin()
        # Full-width tables so one rotation is x * cos + roll(x) * sin_signed: roll(x, half) is
        # [x2, x1] and sin_signed is [-sin, sin], which gives HF's [x1 cos - x2 sin, x2 cos + x1 sin].
        self.cos = torch.cat((cos, cos), dim=-1).to(device)  # [max_positions, head_dim]
        self.sin_signed = torch.cat((-sin, sin), dim=-1).to(device)
        self.half_dim = head_dim // 2  # not `half`: that is nn.Module.half(), the dtype conversion

    def lookup(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and signed sin rows for these positions, [tokens, 1, head_dim]; shared by every layer."""
        return self.cos[positions][:, None, :], self.sin_signed[positions][:, None, :]

    def half_lookup(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin of these positions, [tokens, head_dim / 2] float32 (the fused kernel's layout)."""
        return self.cos[positions, : self.half_dim], self.sin_signed[positions, self.half_dim :]

    def forward(self, table: tuple[torch.Tensor, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        """x: [tokens, heads, head_dim]; rotated in float32, returned in x's dtype."""
        cos, sin = table
        xf = x.float()
        return torch.addcmul(xf * cos, torch.roll(xf, self.half_dim, -1), sin).to(x.dtype)
