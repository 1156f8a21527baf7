"""What every architecture's builder is given (BuildOptions), and the one place a linear layer is made:
each model builds its projections through ``build_linear``, so a change of the kernel selection
(layers/linear.py's ``make_linear``) is adapted here once for every family."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..layers.blas_switch import BlasSwitch
from ..layers.linear import make_linear
from ..layers.panel import UnpackScratch


@dataclass(frozen=True)
class BuildOptions:
    quant: str  # "none" | "int8" | "int4"
    dtype: torch.dtype  # activation / dense weight dtype
    device: str
    max_positions: int
    int4_group_size: int = 32
    blas: BlasSwitch | None = None  # shared by every dense layer; the runner flips it per step
    packed: bool = False  # dense fp32 / bf16 CPU linears in oneDNN's packed layout (layers/packed.py)
    panel: bool = False  # dense fp32 CPU linears in column panels for the C++ kernel (layers/panel.py)
    panel_codes: bool = False  # panels exactly on a block grid held as codes (layers/coded_panel.py)
    scratch: UnpackScratch | None = None  # the panels' buffer for prefill-sized calls; the model makes it


def build_linear(opt: BuildOptions, weight: torch.Tensor, bias: torch.Tensor | None = None,
                 quant: str | None = None) -> torch.nn.Module:
    """y = x W^T (+ b) with the kernels the options choose. The builder owns the popped checkpoint
    tensors, so the layer may rearrange them in place. ``quant`` overrides the options' (the LM head
    is int8 when the body is int4)."""
    return make_linear(weight, bias, opt.quant if quant is None else quant, opt.dtype, opt.device,
                       opt.int4_group_size, in_place=True, switch=opt.blas, packed=opt.packed, panel=opt.panel,
                       scratch=opt.scratch, codes=opt.panel_codes)


def head_quant(opt: BuildOptions) -> str:
    """The LM head's format: int8 whenever the body is quantized (its logits steer every token)."""
    return "int8" if opt.quant != "none" else "none"
