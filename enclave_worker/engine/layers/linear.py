"""Linear layers: dense (fp32/bf16/fp16) and weight-only int8 / int4 / FP8 quantized matmuls, built
through ``make_linear(weight, bias, options)`` with the kernel the engine's path names (kernel_path.py)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from .coded_panel import try_codes
from .int8_dequant import DEQUANT_MIN_ROWS, dequantized_matmul
from .packed import PackedMatmul, try_pack
from .panel import PanelMatmul, UnpackScratch, try_panel
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
    """Per-output-channel symmetric int8 weights, aten `_weight_int8pack_mm` (weight-only).

    On CPU the kernel runs with bf16 activations (its fast path with AVX512-BF16 / AMX; the fp32-activation
    path is several times slower than a dense fp32 GEMM); the output is returned in the input dtype.
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype, device: str) -> None:
        super().__init__()
        w = weight.float()
        scale = (w.abs().amax(dim=1) / 127.0).clamp(min=1e-12)
        self.qweight = torch.round(w / scale[:, None]).clamp(-128, 127).to(torch.int8).to(device)
        self.act_dtype = torch.bfloat16 if _int8_op_works(device, torch.bfloat16) else dtype
        self.scale = scale.to(device=device, dtype=self.act_dtype)
        self.scale_full = scale.to(device=device, dtype=dtype)
        self.fused = _int8_op_works(device, self.act_dtype)
        self.bias = None if bias is None else bias.to(device=device, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])
        if x2.shape[0] >= DEQUANT_MIN_ROWS:  # the kernel loops over rows: a dense GEMM on float slices wins
            y = dequantized_matmul(x2, self.qweight, self.scale_full)
        elif self.fused:
            y = torch.ops.aten._weight_int8pack_mm(x2.to(self.act_dtype), self.qweight, self.scale)
        else:
            y = (x2 @ self.qweight.to(x2.dtype).T) * self.scale_full
        y = y.to(x.dtype)
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


def _int8_op_works(device: str, dtype: torch.dtype) -> bool:
    try:
        x = torch.ones(1, 8, device=device, dtype=dtype)
        w = torch.ones(8, 8, device=device, dtype=torch.int8)
        s = torch.ones(8, device=device, dtype=dtype)
        torch.ops.aten._weight_int8pack_mm(x, w, s)
        return True
    except (RuntimeError, NotImplementedError):
        return False


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
