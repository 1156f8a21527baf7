"""What every architecture's builder is given (BuildOptions), and the one place a linear layer is made:
each model builds its projections through ``build_linear``, so a change of the kernel selection
(layers/linear.py's ``make_linear``) is adapted here once for every family."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..layers.linear import LinearOptions, make_linear
from ..layers.panel import UnpackScratch

DENSE_KERNELS = ("panels", "onednn-packed", "torch")  # layers/linear.py dense_matmul


@dataclass(frozen=True)
class BuildOptions:
    linear: LinearOptions  # how every linear is built (make_linear), the kernel the engine's path names
    max_positions: int
    # Told each consumed checkpoint tensor no built layer holds (Checkpoint.release; models/weights.py).
    release: Callable[[torch.Tensor], None] | None = None

    @property
    def quant(self) -> str:  # "none" | "int8" | "int4" | "fp8"
        return self.linear.quant

    @property
    def dtype(self) -> torch.dtype:  # activation / dense weight dtype
        return self.linear.dtype

    @property
    def device(self) -> str:
        return self.linear.device

    def with_scratch(self, scratch: UnpackScratch | None) -> BuildOptions:
        """The same options, the linears handed over in place, with the model's panel buffer (or none)."""
        return dataclasses.replace(self, linear=dataclasses.replace(self.linear, in_place=True, scratch=scratch))


def build_linear(opt: BuildOptions, weight: torch.Tensor, bias: torch.Tensor | None = None,
                 quant: str | None = None) -> torch.nn.Module:
    """y = x W^T (+ b) with the kernels the options choose. The builder owns the popped checkpoint
    tensors, so the layer may rearrange them in place. ``quant`` overrides the options' (the LM head
    is int8 when the body is int4)."""
    linear = dataclasses.replace(opt.linear, in_place=True, quant=opt.linear.quant if quant is None else quant)
    if linear.quant == "none" and linear.kernel not in DENSE_KERNELS:
        # A dense layer in a quantized model (an MoE router): the path names the quantized kernel, so
        # the dense one is torch's, as for every dense layer off the CPU's fp32 / bf16 paths.
        linear = dataclasses.replace(linear, kernel="torch")
    return make_linear(weight, bias, linear)


def head_quant(opt: BuildOptions) -> str:
    """The LM head's format: int8 whenever the body is quantized (its logits steer every token)."""
    return "int8" if opt.quant != "none" else "none"
