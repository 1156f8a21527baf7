"""Dense bf16 weights prepacked once for oneDNN's CPU GEMM (the bf16 path on CPUs where oneDNN runs
bf16, kernel_path.py).

oneDNN streams a weight fastest in its own blocked layout; packing on every call (what F.linear does
inside its GEMM) is the cost it saves. The packed weight is the layer's one
plaintext copy: the source matrix is zeroed after packing when the caller hands it over (a
decrypted package's buffer then holds zeros there), and the packed buffer is a torch tensor (an
opaque-layout tensor that ``zero_every_byte`` clears with memset), so ``LLMEngine.wipe`` reaches it
like any other weight. A layout with padding beyond the matrix's own elements is refused: a
wipe check that reads the elements back could not see the padding.
"""

from __future__ import annotations

import ctypes

import torch

PACK_ROWS = 64  # the batch the layout is chosen for (decode steps run up to max_num_seqs = 64 rows)


class PackingError(RuntimeError):
    """This torch build or CPU cannot pack the weight into a layout the wipe fully covers."""


def packing_available() -> bool:
    """Whether this torch has oneDNN and its linear ops (CPU builds for x86 and arm64 do)."""
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")


def is_zero(tensor: torch.Tensor) -> bool:
    """Every byte zero, for plain and packed (opaque-layout) tensors alike (a packed one read as oneDNN
    holds it, padding included)."""
    if tensor.is_mkldnn:
        return not any(ctypes.string_at(torch.ops.mkldnn.data_ptr(tensor), torch.ops.mkldnn._nbytes(tensor)))
    return not bool(tensor.any())


def zero_every_byte(tensor: torch.Tensor) -> None:
    """The wipe of one tensor. A packed (MKLDNN) tensor is cleared with memset over oneDNN's allocation:
    torch's ``zero_`` on one writes as if its elements were plain, which corrupted the heap for bf16
    and would miss a padded tail."""
    if tensor.is_mkldnn:
        ctypes.memset(torch.ops.mkldnn.data_ptr(tensor), 0, torch.ops.mkldnn._nbytes(tensor))
    else:
        tensor.zero_()


def bf16_native() -> bool:
    """Whether oneDNN runs bf16 on this CPU (kernel_path.py's class x86-avx512-bf16)."""
    return packing_available() and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


class PackedMatmul:
    """y = x W^T (+ b) for a bf16 W [out, in] held only in oneDNN's packed layout; it takes its input
    in bf16 (what the kernel reads) and answers in the input's dtype."""

    def __init__(self, weight: torch.Tensor, consume: bool) -> None:
        """``consume``: the weight's memory is ours; zero it once the packed copy exists."""
        if weight.dtype != torch.bfloat16 or weight.device.type != "cpu" or weight.dim() != 2:
            raise PackingError("packed weights are bf16 matrices on the CPU")
        if not bf16_native():
            # torch refuses to reorder bf16 without AVX512BW/VL/DQ or AVX-NE-CONVERT (an AVX2 Zen 3):
            # asked anyway, it raises a RuntimeError mid-build; the layer keeps torch's kernel instead.
            raise PackingError("this CPU has no bf16 support in oneDNN")
        self.out_features, self.in_features = weight.shape
        with torch.inference_mode():
            # The layout is probed on zeros first: a padded layout is refused before any weight value is
            # copied into it (zero_ on a padded bf16 layout corrupted the heap, so it is never called).
            probe = torch.ops.mkldnn._reorder_linear_weight(torch.zeros_like(weight), PACK_ROWS)
            if torch.ops.mkldnn._nbytes(probe) != probe.numel() * probe.element_size():
                raise PackingError(f"oneDNN pads a {tuple(weight.shape)} weight; it would not wipe as checked")
            del probe
            packed = torch.ops.mkldnn._reorder_linear_weight(weight.contiguous(), PACK_ROWS)
            if consume:
                weight.zero_()
        self.packed = packed
        self.dtype = weight.dtype

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        shape, dtype = x.shape, x.dtype
        x2 = x.reshape(-1, self.in_features)
        if dtype != self.dtype:
            x2, bias = x2.to(self.dtype), None if bias is None else bias.to(self.dtype)
        y: torch.Tensor = torch.ops.mkldnn._linear_pointwise(x2, self.packed, bias, "none", [], "")
        return y.to(dtype).reshape(*shape[:-1], self.out_features)


def try_pack(weight: torch.Tensor, consume: bool) -> PackedMatmul | None:
    """The packed matmul, or None where this weight cannot be packed (the caller keeps the plain one)."""
    try:
        return PackedMatmul(weight, consume)
    except PackingError:
        return None
