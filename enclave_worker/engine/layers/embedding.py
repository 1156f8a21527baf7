"""Token embedding and (optionally tied) LM head; int8 row-quantized when weights are quantized,
oneDNN-packed for the head when the model's linears are, in column panels when they are (the table
held once, as the head's panels; a lookup gathers from them)."""

from __future__ import annotations

import dataclasses

import torch

from .linear import DenseMatmul, LinearOptions, _int8_op_works, dense_matmul
from .packed import PackedMatmul
from .panel import PanelMatmul


class Embedding(torch.nn.Module):
    def __init__(self, weight: torch.Tensor, options: LinearOptions, tied: bool = False) -> None:
        """``tied``: the table is the LM head too, held under ``options.kernel`` (LinearOptions): in
        panels the table is held once, as the head's panels (the lookup reads them); oneDNN-packed, the
        head is a second copy of the table, held and wiped like every weight (layers/packed.py)."""
        super().__init__()
        quant, dtype, device, in_place = options.quant, options.dtype, options.device, options.in_place
        self.quantized = quant in ("int8", "int4")
        self.head: DenseMatmul | PackedMatmul | PanelMatmul
        self.in_panels = False  # the quantized table has no `head` module: test this, not it
        if self.quantized:
            w = weight.float()
            scale = (w.abs().amax(dim=1) / 127.0).clamp(min=1e-12)
            self.weight = torch.round(w / scale[:, None]).clamp(-128, 127).to(torch.int8).to(device)
            self.scale = scale.to(device=device, dtype=dtype)
            self.head_dtype = torch.bfloat16 if _int8_op_works(device, torch.bfloat16) else dtype
            self.head_scale = scale.to(device=device, dtype=self.head_dtype)
            self.fused = _int8_op_works(device, self.head_dtype)
        elif tied and options.kernel == "onednn-packed":
            w = weight.to(device=device, dtype=dtype)
            self.weight = w if w is not weight or in_place else w.clone()
            if in_place and w is not weight:
                weight.zero_()  # the handed-over source in another dtype: no longer needed
            self.head = dense_matmul(self.weight, dataclasses.replace(options, in_place=False))
        else:
            w = weight.to(device=device, dtype=dtype)
            owned = in_place or w is not weight
            kernel = options.kernel if tied and options.kernel == "panels" else "torch"
            self.head = dense_matmul(w, dataclasses.replace(options, kernel=kernel, in_place=owned, scratch=None))
            self.in_panels = isinstance(self.head, PanelMatmul)
            self.weight = self.head.panels if isinstance(self.head, PanelMatmul) else w
        self.dtype = dtype

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.in_panels:
            assert isinstance(self.head, PanelMatmul)
            return self.head.rows(ids)
        rows = self.weight[ids]
        if self.quantized:
            return rows.to(self.dtype) * self.scale[ids][:, None]
        return rows

    def as_lm_head(self, x: torch.Tensor) -> torch.Tensor:
        """Tied LM head: logits = x E^T."""
        if not self.quantized:
            return self.head(x)
        xh = x.to(self.head_dtype)  # bf16 activations: the int8 kernel's fast path (see Int8Linear)
        if self.fused:
            out: torch.Tensor = torch.ops.aten._weight_int8pack_mm(xh, self.weight, self.head_scale)
            return out.to(x.dtype)
        return ((xh @ self.weight.to(xh.dtype).T) * self.head_scale).to(x.dtype)
