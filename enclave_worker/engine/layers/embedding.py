"""Token embedding and (optionally tied) LM head; int8 when weights are quantized (in blocks of 32 on
the CPU, layers/q8_blocks.py; per row elsewhere), oneDNN-packed for the head when the model's linears
are, in column panels when they are (the table held once, as the head's panels; a lookup gathers from
them). A GGUF Q8_0 table (checkpoint.load_gguf, native) is taken as its codes and scales on the CPU's
int8 path, with no float32 copy; for any other layout it is dequantized first."""

from __future__ import annotations

import dataclasses

import torch

from .int8_torch import TorchInt8Matmul, per_channel
from .linear import DenseMatmul, LinearOptions, dense_matmul
from .packed import PackedMatmul
from .panel import PanelMatmul
from .q8_blocks import Q8BlockMatmul
from .quantized_weight import INT8_BLOCK, QuantizedWeight, dequantize


class Embedding(torch.nn.Module):
    def __init__(self, weight: torch.Tensor, options: LinearOptions, tied: bool = False) -> None:
        """``tied``: the table is the LM head too, held under ``options.kernel`` (LinearOptions): in
        panels the table is held once, as the head's panels (the lookup reads them); oneDNN-packed, the
        head is a second copy of the table, held and wiped like every weight (layers/packed.py)."""
        super().__init__()
        quant, dtype, device, in_place = options.quant, options.dtype, options.device, options.in_place
        if isinstance(weight, QuantizedWeight) and not (
            _q8_blocks(weight) and quant in ("int8", "int4") and torch.device(device).type == "cpu"
        ):
            weight = dequantize(weight)  # a GGUF Q8_0 table for another layout: its float32 values, as before
        self.quantized = quant in ("int8", "int4")
        self.head: DenseMatmul | PackedMatmul | PanelMatmul
        self.in_panels = False  # the quantized table has no `head` module: test this, not it
        if self.quantized:  # int8: q8 blocks on the CPU (layers/q8_blocks.py), torch's per-channel kernels elsewhere
            self.table: Q8BlockMatmul | TorchInt8Matmul
            if isinstance(weight, QuantizedWeight):  # Q8_0's codes and scales are this layout's
                self.table = Q8BlockMatmul(weight.codes(), weight.scales, consume=True)
            elif torch.device(device).type == "cpu":
                self.table = Q8BlockMatmul.from_float(weight)
            else:
                self.table = TorchInt8Matmul(*per_channel(weight), dtype, device, dense_from=None)
            self.weight = self.table.codes if isinstance(self.table, Q8BlockMatmul) else self.table.qweight
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
        if self.quantized:
            return self.table.rows(ids).to(self.dtype)
        return self.weight[ids]

    def as_lm_head(self, x: torch.Tensor) -> torch.Tensor:
        """Tied LM head: logits = x E^T."""
        if not self.quantized:
            return self.head(x)
        return self.table(x).to(x.dtype)


def _q8_blocks(w: QuantizedWeight) -> bool:
    """int8 codes with a float32 scale per block of 32 along K: Q8BlockMatmul's input as it is."""
    return w.spec.scheme == "int8" and w.spec.group_size == INT8_BLOCK and w.scales.dtype == torch.float32
