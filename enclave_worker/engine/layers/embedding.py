"""Token embedding and (optionally tied) LM head; int8 row-quantized when weights are quantized."""

from __future__ import annotations

import torch

from .linear import _int8_op_works


class Embedding(torch.nn.Module):
    def __init__(self, weight: torch.Tensor, quant: str, dtype: torch.dtype, device: str) -> None:
        super().__init__()
        self.quantized = quant in ("int8", "int4")
        if self.quantized:
            w = weight.float()
            scale = (w.abs().amax(dim=1) / 127.0).clamp(min=1e-12)
            self.weight = torch.round(w / scale[:, None]).clamp(-128, 127).to(torch.int8).to(device)
            self.scale = scale.to(device=device, dtype=dtype)
            self.head_dtype = torch.bfloat16 if _int8_op_works(device, torch.bfloat16) else dtype
            self.head_scale = scale.to(device=device, dtype=self.head_dtype)
            self.fused = _int8_op_works(device, self.head_dtype)
        else:
            self.weight = weight.to(device=device, dtype=dtype)
        self.dtype = dtype

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        rows = self.weight[ids]
        if self.quantized:
            return rows.to(self.dtype) * self.scale[ids][:, None]
        return rows

    def as_lm_head(self, x: torch.Tensor) -> torch.Tensor:
        """Tied LM head: logits = x E^T."""
        if not self.quantized:
            return torch.nn.functional.linear(x, self.weight)
        xh = x.to(self.head_dtype)  # bf16 activations: the int8 kernel's fast path (see Int8Linear)
        if self.fused:
            return torch.ops.aten._weight_int8pack_mm(xh, self.weight, self.head_scale).to(x.dtype)
        return ((xh @ self.weight.to(xh.dtype).T) * self.head_scale).to(x.dtype)
