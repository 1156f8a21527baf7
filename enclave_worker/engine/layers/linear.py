"""Linear layers: dense (fp32/bf16/fp16) and int8 (layers/q8_blocks.py on the CPU) / int4 / FP8 quantized
matmuls, built through ``make_linear(weight, bias, options)`` with the kernel the engine's path names
(kernel_path.py)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from .coded_panel import try_codes
from .int8_torch import TorchInt8Matmul, per_channel
from .packed import PackedMatmul, try_pack
from .panel import PanelMatmul, UnpackScratch, try_panel
from .q8_blocks import Q8BlockMatmul
from .quantized_weight import QuantizedWeight


@dataclass(frozen=True)
class LinearOptions:
    """How a model's linears are built (one value per model; models/ pass it to ``make_linear``).

    ``quant``: "none" | "int8" | "int4" | "fp8"; ``dtype``: the activation / dense weight dtype;
    ``kernel``: a dense layer's kernel, KernelPath.linear ("panels" | "onednn-packed" | "torch"; ignored
    for quantized weights); ``codes``: panels exactly on a block grid are held as codes
    (layers/coded_panel.py: the same results to the bit); ``in_place``: the caller hands over each
    weight's memory (the builder's popped checkpoint tensors), so a layer may rearrange or zero it;
    ``scratch``: the model's buffer for the panels' prefill-sized calls."""

    quant: str = "none"
    dtype: torch.dtype = torch.float32
    device: str = "cpu"
    kernel: str = "torch"
    codes: bool = False
    in_place: bool = False
    int4_group_size: int = 32
    scratch: UnpackScratch | None = None


class DenseMatmul:
    """y = x W^T (+ b) for a dense weight W [out, in] with torch's ``F.linear``."""

    def __init__(self, weight: torch.Tensor) -> None:
        self.weight = weight

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        return torch.nn.functional.linear(x, self.weight, bias)


def dense_matmul(weight: torch.Tensor, options: LinearOptions) -> DenseMatmul | PackedMatmul | PanelMatmul:
    """``weight`` (already in the model's dtype and device) under the options' kernel. A layer the kernel
    cannot take (panels: an output count off the panel width; packed: a layout oneDNN pads) keeps
    torch's ``F.linear``: which layers those are follows from the model's shapes alone."""
    if options.kernel == "panels":
        pp = ((try_codes(weight, consume=options.in_place, scratch=options.scratch) if options.codes else None)
              or try_panel(weight, consume=options.in_place, scratch=options.scratch))
        if pp is not None:
            return pp
    elif options.kernel == "onednn-packed":
        pm = try_pack(weight, consume=options.in_place)
        if pm is not None:
            return pm
    elif options.kernel != "torch":
        raise ValueError(f"unknown dense kernel {options.kernel!r}")
    return DenseMatmul(weight)


class Linear(torch.nn.Module):
    """Dense y = x W^T (+ b) under ``options.kernel`` (LinearOptions)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, options: LinearOptions) -> None:
        super().__init__()
        w = weight.to(device=options.device, dtype=options.dtype)
        self.bias = None if bias is None else bias.to(device=options.device, dtype=options.dtype)
        owned = options.in_place or w is not weight  # a converted copy is ours whatever the caller said
        self.matmul = dense_matmul(w, dataclasses.replace(options, in_place=owned))
        if isinstance(self.matmul, PackedMatmul) and options.in_place and w is not weight:
            weight.zero_()  # the handed-over source (fp32 of a bf16 layer): the packed copy is the only one
        self.weight = (self.matmul.packed if isinstance(self.matmul, PackedMatmul)
                       else self.matmul.panels if isinstance(self.matmul, PanelMatmul) else self.matmul.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.matmul(x, self.bias)


class Int8Linear(torch.nn.Module):
    """Symmetric int8 weights. On the CPU in blocks of 32 along K, a scale each, times activations
    quantized per row and block (layers/q8_blocks.py: one C++ kernel); elsewhere per output channel in
    torch's int8 kernels (layers/int8_torch.py). The output is in the input's dtype."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype, device: str) -> None:
        super().__init__()
        self.matmul: Q8BlockMatmul | TorchInt8Matmul
        if torch.device(device).type == "cpu":
            self.matmul = Q8BlockMatmul.from_float(weight)
        else:
            self.matmul = TorchInt8Matmul(*per_channel(weight), dtype, device)
        self.bias = None if bias is None else bias.to(device=device, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        y = self.matmul(x.reshape(-1, shape[-1])).to(x.dtype)
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*shape[:-1], y.shape[-1])


class Int4Linear(torch.nn.Module):
    """Group-wise asymmetric 4-bit weights (torch int4pack layout), float activations."""

    def __init__(
        self,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        dtype: torch.dtype,
        device: str,
        group_size: int = 32,
    ) -> None:
        super().__init__()
        n, k = weight.shape
        if k % group_size:
            raise ValueError(f"in_features {k} not divisible by int4 group size {group_size}")
        wg = weight.float().reshape(n, k // group_size, group_size)
        lo, hi = wg.amin(-1), wg.amax(-1)
        scale = ((hi - lo) / 15.0).clamp(min=1e-12)
        q = torch.round((wg - lo[..., None]) / scale[..., None]).clamp(0, 15).to(torch.int32).reshape(n, k)
        zeros = lo + 8.0 * scale  # the kernel computes (q - 8) * scale + zero
        self.group_size = group_size
        self.out_features = n
        self.device_type = torch.device(device).type
        if self.device_type == "cpu":
            self.packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 2)
            # the CPU kernel is fastest with bf16 activations (AVX512-BF16 / AMX)
            self.scales_zeros = torch.stack([scale.T, zeros.T], -1).contiguous().to(torch.bfloat16)
        else:  # CUDA kernel wants bf16 activations and the uint8 [n, k/2] input layout
            qu8 = (q[:, ::2] << 4 | q[:, 1::2]).to(torch.uint8).to(device)
            self.packed = torch.ops.aten._convert_weight_to_int4pack(qu8, 8)
            self.scales_zeros = torch.stack([scale.T, zeros.T], -1).contiguous().to(device, torch.bfloat16)
        self.bias = None if bias is None else bias.to(device=device, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])
        y: torch.Tensor
        if self.device_type == "cpu":
            y = torch.ops.aten._weight_int4pack_mm_for_cpu(
                x2.to(torch.bfloat16), self.packed, self.group_size, self.scales_zeros
            ).to(x.dtype)
        else:
            y = torch.ops.aten._weight_int4pack_mm(
                x2.to(torch.bfloat16), self.packed, self.group_size, self.scales_zeros
            ).to(x.dtype)
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*shape[:-1], self.out_features)


class Fp8Linear(torch.nn.Module):
    """FP8 (e4m3) weights with a scale per output channel; activations quantized per token on the fly;
    `torch._scaled_mm` (Hopper's FP8 tensor cores on CUDA; a reference kernel on the CPU)."""

    FP8_MAX = 448.0  # largest finite float8_e4m3fn

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype, device: str) -> None:
        super().__init__()
        w = weight.float()
        scale = (w.abs().amax(dim=1, keepdim=True) / self.FP8_MAX).clamp(min=1e-12)  # [n, 1]
        self.qweight = (w / scale).to(torch.float8_e4m3fn).to(device)  # [n, k], row-major
        self.scale_w = scale.T.contiguous().to(device)  # [1, n] float32
        self.out_dtype = torch.bfloat16 if dtype != torch.float32 else torch.float32
        self.dtype = dtype
        self.bias = None if bias is None else bias.to(device=device, dtype=dtype)
        self.out_features = weight.shape[0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x2 = x.reshape(-1, shape[-1]).float()
        scale_x = (x2.abs().amax(dim=1, keepdim=True) / self.FP8_MAX).clamp(min=1e-12)  # [m, 1]
        qx = (x2 / scale_x).to(torch.float8_e4m3fn)
        # qweight.T is column-major, the layout the FP8 GEMM wants for its second operand
        y = torch._scaled_mm(qx, self.qweight.T, scale_a=scale_x, scale_b=self.scale_w, out_dtype=self.out_dtype)
        y = y.to(self.dtype)
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*shape[:-1], self.out_features)


def make_linear(weight: torch.Tensor, bias: torch.Tensor | None, options: LinearOptions) -> torch.nn.Module:
    """The one entry point for a model's linear layers: ``weight`` [out, in], an optional ``bias`` [out],
    built as ``options`` say (LinearOptions). A checkpoint's own quantized weight (QuantizedWeight) is
    served in its own scheme's kernel, whatever ``options.quant`` says (layers/quantized_linear.py)."""
    if isinstance(weight, QuantizedWeight):
        from .quantized_linear import quantized_linear  # imports this module

        return quantized_linear(weight, bias, options.dtype, options.device)
    if options.quant == "fp8":
        return Fp8Linear(weight, bias, options.dtype, options.device)
    if options.quant == "int8":
        return Int8Linear(weight, bias, options.dtype, options.device)
    if options.quant == "int4":
        return Int4Linear(weight, bias, options.dtype, options.device, options.int4_group_size)
    return Linear(weight, bias, options)
