"""Token embedding and (optionally tied) LM head; int8 row-quantized when weights are quantized,
oneDNN-packed for the head when the model's weights are packed, in column panels when they are
in panels (the table held once, as the head's panels; a lookup gathers from them)."""

from __future__ import annotations

import torch

from .blas_switch import BlasSwitch
from .coded_panel import try_codes
from .linear import DenseMatmul, _int8_op_works
from .packed import PackedMatmul
from .panel import PanelMatmul, try_panel


class Embedding(torch.nn.Module):
    def __init__(
        self,
        weight: torch.Tensor,
        quant: str,
        dtype: torch.dtype,
        device: str,
        in_place: bool = False,
        switch: BlasSwitch | None = None,
        packed: bool = False,
        panel: bool = False,
        codes: bool = False,
    ) -> None:
        """``packed``: a dense table also held as a oneDNN-packed tied head (fp32 / bf16 on the CPU);
        ``panel``: an fp32 table held only as the tied head's panels (layers/panel.py); ``codes``: those
        panels held as codes where the table is exactly on a block grid (layers/coded_panel.py)."""
        super().__init__()
        self.quantized = quant in ("int8", "int4")
        pp = None
        if panel and not self.quantized:
            w = weight.to(device=device, dtype=dtype)
            owned = in_place or w is not weight
            pp = (try_codes(w, consume=owned) if codes else None) or try_panel(w, consume=owned)
        self.head: DenseMatmul | PackedMatmul | PanelMatmul
        self.in_panels = pp is not None  # the quantized table has no `head` module: test this, not it
        if pp is not None:
            self.head, self.weight = pp, pp.panels
        elif self.quantized:
            w = weight.float()
            scale = (w.abs().amax(dim=1) / 127.0).clamp(min=1e-12)
            self.weight = torch.round(w / scale[:, None]).clamp(-128, 127).to(torch.int8).to(device)
            self.scale = scale.to(device=device, dtype=dtype)
            self.head_dtype = torch.bfloat16 if _int8_op_works(device, torch.bfloat16) else dtype
            self.head_scale = scale.to(device=device, dtype=self.head_dtype)
            self.fused = _int8_op_works(device, self.head_dtype)
        elif packed:
            # Rows for the lookup, and the tied head packed for oneDNN (a second copy of the table in
            # the compute dtype, held and wiped like every weight: layers/packed.py).
            w = weight.to(device=device, dtype=dtype)
            self.weight = w if w is not weight or in_place else w.clone()
            if in_place and w is not weight:
                weight.zero_()  # the handed-over source in another dtype: no longer needed
            self.head = PackedMatmul(self.weight, consume=False)
        else:
            # Stored [hidden, vocab] on CPU in fp32 (the LM head's fast matrix-vector layout, see
            # DenseMatmul); a lookup gathers columns instead of rows.
            w = weight.to(device=device, dtype=dtype)
            self.head = DenseMatmul(w, transpose=True, in_place=in_place or w is not weight, switch=switch)
            self.weight = self.head.weight
        self.dtype = dtype

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.in_panels:
            assert isinstance(self.head, PanelMatmul)
            return self.head.rows(ids)
        if not self.quantized and not self.weight.is_contiguous():  # stored transposed
            return self.weight.t().index_select(1, ids).t().contiguous()
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
