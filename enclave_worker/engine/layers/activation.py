"""Gated activations over the fused gate/up projection: SiLU (SwiGLU) and GELU-tanh (GeGLU)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up


def gelu_tanh_and_mul(x: torch.Tensor) -> torch.Tensor:
    """GeGLU (Gemma): GELU (tanh approximation) of the gate times up."""
    gate, up = x.chunk(2, dim=-1)
    return F.gelu(gate, approximate="tanh") * up


def act_and_mul(x: torch.Tensor, activation: str) -> torch.Tensor:
    """The gated MLP's activation over the fused gate/up output: "silu" (SwiGLU) or "gelu_tanh" (GeGLU)."""
    return gelu_tanh_and_mul(x) if activation == "gelu_tanh" else silu_and_mul(x)
