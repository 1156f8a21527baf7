"""Linear layers built straight from a checkpoint's quantized weight (layers/quantized_weight.py): the
codes go into the same kernels as layers/linear.py's Int4Linear, Int8Linear and Fp8Linear (aten's
int4 / FP8 ops, the CPU's int8 block kernel of layers/q8_blocks.py; same activation dtypes) without a
float copy. Not subclasses of those: linear.py's make_linear dispatches here, and import-linter forbids
the circle."""

from __future__ import annotations

import torch

from .int8_torch import TorchInt8Matmul, per_channel
from .q8_blocks import Q8BlockMatmul, channel_scales_to_blocks
from .quantized_weight import QuantizedWeight, dequantize

_PACK_ROWS = 1024  # rows converted per call: the int32 transient stays small (torch packs 64-row tiles)


def _out(y: torch.Tensor, x: torch.Tensor, bias: torch.Tensor | None, shape: torch.Size, n: int) -> torch.Tensor:
    y = y.to(x.dtype)
    if bias is not None:
        y = y + bias
    return y.reshape(*shape[:-1], n)


class PrequantizedInt4Linear(torch.nn.Module):
    """A checkpoint's own int4 codes, scales and zeros (and GPTQ's input permutation) in torch's int4pack
    kernels, bf16 activations (their fast path), output in the input dtype."""

    def __init__(self, w: QuantizedWeight, bias: torch.Tensor | None, dtype: torch.dtype, device: str) -> None:
        super().__init__()
        n, k = w.spec.shape
        codes = w.codes()
        assert w.zeros is not None
        self.group_size, self.out_features = w.spec.group_size, n
        self.device_type = torch.device(device).type
        scales_zeros = torch.stack([w.scales.T, w.zeros.T], -1).contiguous()
        if self.device_type == "cpu":
            chunks = []
            for i in range(0, n, _PACK_ROWS):
                c = codes[i : i + _PACK_ROWS]
                q = torch.stack([c & 0xF, c >> 4], -1).reshape(c.shape[0], k).to(torch.int32)
                chunks.append(torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 2))
            self.packed = torch.cat(chunks) if len(chunks) > 1 else chunks[0]
            self.scales_zeros = scales_zeros.to(torch.bfloat16)
        else:  # the CUDA kernel's input: uint8 [n, k/2] with the even column in the high nibble
            swapped = ((codes & 0xF) << 4 | codes >> 4).to(device)
            self.packed = torch.ops.aten._convert_weight_to_int4pack(swapped, 8)
            self.scales_zeros = scales_zeros.to(device, torch.bfloat16)
        self.perm = None if w.perm is None else w.perm.to(device).clone()
        self.bias = None if bias is None else bias.to(device=device, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        if self.perm is not None:
            x = x.index_select(-1, self.perm)
        x2 = x.reshape(-1, shape[-1]).to(torch.bfloat16)
        if self.device_type == "cpu":
            y = torch.ops.aten._weight_int4pack_mm_for_cpu(x2, self.packed, self.group_size, self.scales_zeros)
        else:
            y = torch.ops.aten._weight_int4pack_mm(x2, self.packed, self.group_size, self.scales_zeros)
        return _out(y, x, self.bias, shape, self.out_features)


class PrequantizedInt8Linear(torch.nn.Module):
    """A checkpoint's int8 codes. On the CPU: layers/q8_blocks.py's kernel, the codes as they are with
    their block scales (GGUF Q8_0's, exactly) or their channel scale repeated for every block. Elsewhere:
    torch's per-channel int8 kernels, block-scaled codes requantized per channel at load."""

    def __init__(self, w: QuantizedWeight, bias: torch.Tensor | None, dtype: torch.dtype, device: str) -> None:
        super().__init__()
        n, k = w.spec.shape
        self.matmul: Q8BlockMatmul | TorchInt8Matmul
        if torch.device(device).type == "cpu":
            blocks = w.scales if w.scales.dim() == 2 else channel_scales_to_blocks(w.scales, k)
            self.matmul = Q8BlockMatmul(w.codes(), blocks, consume=False)
            if blocks is not w.scales:
                blocks.zero_()  # our expansion of the channel scales; the checkpoint's own stay its to release
        elif w.scales.dim() == 2:
            self.matmul = TorchInt8Matmul(*per_channel(dequantize(w)), dtype, device)
        else:
            self.matmul = TorchInt8Matmul(w.codes(), w.scales, dtype, device)
        self.bias = None if bias is None else bias.to(device=device, dtype=dtype)
        self.out_features = n

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        return _out(self.matmul(x.reshape(-1, shape[-1])), x, self.bias, shape, self.out_features)


class PrequantizedFp8Linear(torch.nn.Module):
    """e4m3 codes with a scale per output channel (a per-tensor scale, broadcast); activations quantized
    per token on the fly; `torch._scaled_mm`, as Fp8Linear."""

    FP8_MAX = 448.0

    def __init__(self, w: QuantizedWeight, bias: torch.Tensor | None, dtype: torch.dtype, device: str) -> None:
        super().__init__()
        self.qweight = w.codes().to(device)
        self.scale_w = w.scales.reshape(1, -1).contiguous().to(device)
        self.out_dtype = torch.bfloat16 if dtype != torch.float32 else torch.float32
        self.dtype = dtype
        self.bias = None if bias is None else bias.to(device=device, dtype=dtype)
        self.out_features = w.spec.shape[0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x2 = x.reshape(-1, shape[-1]).float()
        scale_x = (x2.abs().amax(dim=1, keepdim=True) / self.FP8_MAX).clamp(min=1e-12)
        qx = (x2 / scale_x).to(torch.float8_e4m3fn)
        y = torch._scaled_mm(qx, self.qweight.T, scale_a=scale_x, scale_b=self.scale_w, out_dtype=self.out_dtype)
        return _out(y.to(self.dtype), x, self.bias, shape, self.out_features)


class RowBlocksLinear(torch.nn.Module):
    """Fused rows whose parts are in different schemes: each part in its own kernel, outputs side by side."""

    def __init__(self, w: QuantizedWeight, bias: torch.Tensor | None, dtype: torch.dtype, device: str) -> None:
        super().__init__()
        sizes = [p.spec.shape[0] for p in w.parts]
        biases: list[torch.Tensor | None] = [None] * len(sizes)
        if bias is not None:
            biases = list(torch.split(bias, sizes))
        self.parts = torch.nn.ModuleList(quantized_linear(p, b, dtype, device) for p, b in zip(w.parts, biases,
                                                                                                strict=True))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([p(x) for p in self.parts], dim=-1)


def quantized_linear(w: QuantizedWeight, bias: torch.Tensor | None, dtype: torch.dtype,
                     device: str) -> torch.nn.Module:
    """The layer for a checkpoint's quantized weight, in the kernel of its scheme."""
    layers = {"int4": PrequantizedInt4Linear, "int8": PrequantizedInt8Linear, "fp8": PrequantizedFp8Linear,
              "rows": RowBlocksLinear}
    return layers[w.spec.scheme](w, bias, dtype, device)
