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
        self.cos = freqs.cos().to(device)  # [max_positions, head_dim // 2]
        self.sin = freqs.sin().to(device)

    def forward(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """x: [tokens, heads, head_dim]; rotated in float32, returned in x's dtype."""
        cos = self.cos[positions][:, None, :]
        sin = self.sin[positions][:, None, :]
        xf = x.float()
        x1, x2 = xf.chunk(2, dim=-1)
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)
