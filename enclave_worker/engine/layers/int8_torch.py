"""Per-output-channel int8 weights in torch's kernels: the int8 path off the CPU (a GPU). The CPU's
int8 layers run layers/q8_blocks.py's kernel instead.

Below ``DENSE_MIN_ROWS`` rows `_weight_int8pack_mm` (bf16 activations where it runs); from there the
layers multiply by the whole weight dequantized (a GPU's GEMM wants the whole matrix; its memory is
not the bottleneck), as before the CPU had its own kernel.
"""

from __future__ import annotations

import torch

DENSE_MIN_ROWS = 16  # from this many rows the layers dequantize (the aten kernel loops over rows)


def int8_op_works(device: str, dtype: torch.dtype) -> bool:
    try:
        x = torch.ones(1, 8, device=device, dtype=dtype)
        torch.ops.aten._weight_int8pack_mm(x, torch.ones(8, 8, device=device, dtype=torch.int8),
                                           torch.ones(8, device=device, dtype=dtype))
        return True
    except (RuntimeError, NotImplementedError):
        return False


def per_channel(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """float [N, K] -> symmetric int8 codes [N, K] and a float32 scale per output channel [N]."""
    w = w.float()
    scale = (w.abs().amax(dim=1) / 127.0).clamp(min=1e-12)
    return torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8), scale


class TorchInt8Matmul:
    """y = x (q * scale[:, None])^T for int8 codes q [N, K] and a scale per channel, on ``device``.
    ``dense_from``: rows from which the whole weight is dequantized per call (None: never)."""

    def __init__(self, codes: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype, device: str,
                 dense_from: int | None = DENSE_MIN_ROWS) -> None:
        self.qweight = codes.to(device)
        self.act_dtype = torch.bfloat16 if int8_op_works(device, torch.bfloat16) else dtype
        self.scale = scale.to(device=device, dtype=self.act_dtype)
        self.scale_full = scale.to(device=device, dtype=dtype)
        self.fused = int8_op_works(device, self.act_dtype)
        self.dense_from = dense_from

    def __call__(self, x2: torch.Tensor) -> torch.Tensor:
        if self.dense_from is not None and x2.shape[0] >= self.dense_from:
            return torch.nn.functional.linear(x2, self.qweight.to(x2.dtype) * self.scale_full[:, None].to(x2.dtype))
        if self.fused:
            y: torch.Tensor = torch.ops.aten._weight_int8pack_mm(x2.to(self.act_dtype), self.qweight, self.scale)
            return y
        return (x2 @ self.qweight.to(x2.dtype).T) * self.scale_full

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """W's rows ``ids`` [T] -> [T, K] in the layer's dtype (an embedding's lookup)."""
        return self.qweight[ids].to(self.scale_full.dtype) * self.scale_full[ids][:, None]
