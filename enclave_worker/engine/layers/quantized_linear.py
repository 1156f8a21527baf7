"""Linear layers built straight from a checkpoint's quantized weight (layers/quantized_weight.py): the
codes go into the engine's int4 / int8 / FP8 kernels (layers/linear.py) without a float copy."""

from __future__ import annotations

import torch

from .linear import Fp8Linear, Int4Linear, Int8Linear, _int8_op_works
from .quantized_weight import QuantizedWeight

_PACK_ROWS = 1024  # rows converted per call: the int32 transient stays small (torch packs 64-row tiles)


class PrequantizedInt4Linear(Int4Linear):
    """Int4Linear over a checkpoint's own int4 codes, scales and zeros (and GPTQ's input permutation)."""

    def __init__(self, w: QuantizedWeight, bias: torch.Tensor | None, dtype: torch.dtype, device: str) -> None:
        torch.nn.Module.__init__(self)
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
        self.perm = None if w.perm is None else w.perm.to(device)
        self.bias = None if bias is None else bias.to(device=device, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.perm is not None:
            x = x.index_select(-1, self.perm)
        return super().forward(x)


class PrequantizedInt8Linear(Int8Linear):
    """Int8Linear over a checkpoint's per-channel int8 codes and scales."""

    def __init__(self, w: QuantizedWeight, bias: torch.Tensor | None, dtype: torch.dtype, device: str) -> None:
        torch.nn.Module.__init__(self)
        self.qweight = w.codes().to(device)
        self.act_dtype = torch.bfloat16 if _int8_op_works(device, torch.bfloat16) else dtype
        self.scale = w.scales.to(device=device, dtype=self.act_dtype)
        self.scale_full = w.scales.to(device=device, dtype=dtype)
        self.fused = _int8_op_works(device, self.act_dtype)
        self.bias = None if bias is None else bias.to(device=device, dtype=dtype)


class PrequantizedFp8Linear(Fp8Linear):
    """Fp8Linear over a checkpoint's e4m3 codes and per-channel scales (a per-tensor scale, broadcast)."""

    def __init__(self, w: QuantizedWeight, bias: torch.Tensor | None, dtype: torch.dtype, device: str) -> None:
        torch.nn.Module.__init__(self)
        self.qweight = w.codes().to(device)
        self.scale_w = w.scales.reshape(1, -1).contiguous().to(device)
        self.out_dtype = torch.bfloat16 if dtype != torch.float32 else torch.float32
        self.dtype = dtype
        self.bias = None if bias is None else bias.to(device=device, dtype=dtype)
        self.out_features = w.spec.shape[0]


class RowBlocksLinear(torch.nn.Module):
    """Fused rows whose parts are in different schemes: each part in its own kernel, outputs side by side."""

    def __init__(self, w: QuantizedWeight, bias: torch.Tensor | None, dtype: torch.dtype, device: str) -> None:
        super().__init__()
        biases = [None] * len(w.parts) if bias is None else bias.split([p.spec.shape[0] for p in w.parts])
        self.parts = torch.nn.ModuleList(quantized_linear(p, b, dtype, device) for p, b in zip(w.parts, biases,
                                                                                                strict=True))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([p(x) for p in self.parts], dim=-1)


def quantized_linear(w: QuantizedWeight, bias: torch.Tensor | None, dtype: torch.dtype,
                     device: str) -> torch.nn.Module:
    """The layer for a checkpoint's quantized weight, in the kernel of its scheme."""
    layers = {"int4": PrequantizedInt4Linear, "int8": PrequantizedInt8Linear, "fp8": PrequantizedFp8Linear,
              "rows": RowBlocksLinear}
    return layers[w.spec.scheme](w, bias, dtype, device)  # type: ignore[abstract]
