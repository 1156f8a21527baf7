"""fp32 weights that lie exactly on a per-block grid, held as int8 codes for the panel kernel
(EngineConfig.panel_codes; kernels/cpu_linear.cpp, "exact block codes").

A GGUF checkpoint in a block format (the default model's linears are Q4_1, its embedding Q8_0) is
dequantized to fp32 when it is loaded (checkpoint.py): every 32 weights of a row along K are then
``d * q + m`` for an integer code q and one half-precision d and m per block. Held as fp32 panels,
a decode step reads 4 bytes a weight, though only the code carries information. Here the layer is
checked, block by block, to lie on such a grid and then held as codes [N / NR, K, NR] int8 with
scales and offsets [N / NR, K / 32, NR] fp32: 1.25 bytes a weight. The kernel rebuilds every weight to
the float the checkpoint held (the product rounded, then the sum, as GGUF's dequantization computes
it) before the same multiply-adds as the fp32 panels', so a call's result is the fp32 panels' result
to the bit: this is a lossless layout, not a quantization. A layer with any block off the grid (a
checkpoint trained or shipped in fp32 or bf16) keeps fp32 panels.

The codes are the layer's plaintext: a source matrix handed over is zeroed once the codes are
written, and codes, scales and offsets are plain tensors that ``LLMEngine.wipe`` zeroes.
"""

from __future__ import annotations

import torch

from ..kernels.cpu_ops import load_cpu_ops
from .panel import PanelMatmul, UnpackScratch, gemm_min_rows


class CodedPanelMatmul(PanelMatmul):
    """y = x W^T for an fp32 W [out, in] held as exact block codes (module doc); built by ``try_codes``."""

    def __init__(
        self, codes: torch.Tensor, scales: torch.Tensor, offsets: torch.Tensor, scratch: UnpackScratch | None
    ) -> None:
        ops = load_cpu_ops()
        self._ops, self.scratch = ops, scratch
        self.width, self.block = int(ops.panel_width()), int(ops.code_block())
        self.codes, self.scales, self.offsets = codes, scales, offsets
        self.panels = codes  # the layer's held weight (Linear.weight), as for the fp32 panels
        self.out_features, self.in_features = codes.shape[0] * self.width, codes.shape[1]
        self.gemm_min_rows = gemm_min_rows(self.width)

    def _kernel(self, x2: torch.Tensor) -> torch.Tensor:
        y: torch.Tensor = self._ops.coded_linear(x2, self.codes, self.scales, self.offsets)
        return y

    def _unpack_into(self, w_t: torch.Tensor) -> None:
        self._ops.coded_unpack(self.codes, self.scales, self.offsets, w_t)

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """W's rows ``ids`` [T] -> [T, in], rebuilt exactly (product, then sum: two roundings, as the kernel)."""
        p, lane = ids // self.width, ids % self.width
        q = self.codes[p, :, lane].to(torch.float32)
        d = self.scales[p, :, lane].repeat_interleave(self.block, dim=1)
        m = self.offsets[p, :, lane].repeat_interleave(self.block, dim=1)
        return (q * d).add_(m)


def try_codes(weight: torch.Tensor, consume: bool, scratch: UnpackScratch | None = None) -> CodedPanelMatmul | None:
    """The coded layer, or None where the weight is not exactly on a block grid (or its shape does not
    fit the kernel's panel width and block). ``consume``: the weight's memory is ours, zeroed once the
    codes hold it."""
    if weight.dtype != torch.float32 or weight.device.type != "cpu" or weight.dim() != 2:
        return None
    ops = load_cpu_ops()
    nr, block = int(ops.panel_width()), int(ops.code_block())
    n, k = weight.shape
    if n == 0 or n % nr or k == 0 or k % block:
        return None
    codes = torch.empty(n // nr, k, nr, dtype=torch.int8)
    scales = torch.empty(n // nr, k // block, nr, dtype=torch.float32)
    offsets = torch.empty_like(scales)
    source = weight if weight.is_contiguous() else weight.contiguous()
    try:
        on_grid = bool(ops.grid_encode(source, codes, scales, offsets))
    finally:
        if source is not weight:
            source.zero_()  # a transient plaintext copy
    if not on_grid:
        for t in (codes, scales, offsets):
            t.zero_()  # the blocks encoded before the one off the grid are plaintext too
        return None
    if consume:
        with torch.inference_mode():
            weight.zero_()  # the fp32 source: the codes are now the layer's one plaintext copy
    return CodedPanelMatmul(codes, scales, offsets, scratch)
