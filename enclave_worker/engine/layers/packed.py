"""Dense fp32 weights prepacked once for the CPU GEMM kernels (EngineConfig.packed_weights).

MKL / oneDNN stream a weight fastest in their own blocked layout; packing on every call (what
F.linear and OpenBLAS do inside sgemm) is the cost they save. The packed weight is the layer's one
plaintext copy: the source matrix is zeroed after packing when the caller hands it over (a
decrypted package's buffer then holds zeros there), and the packed buffer is a torch tensor (an
opaque-layout tensor whose ``zero_`` clears its whole buffer), so ``LLMEngine.wipe`` reaches it
like any other weight. A layout with padding beyond the matrix's own elements is refused: a
wipe check that reads the elements back could not see the padding.
"""

from __future__ import annotations

import torch

PACK_ROWS = 64  # the batch the layout is chosen for (decode steps run up to max_num_seqs = 64 rows)


class PackingError(RuntimeError):
    """This torch build or CPU cannot pack the weight into a layout the wipe fully covers."""


def packing_available() -> bool:
    """Whether this torch has oneDNN and its linear ops (CPU builds for x86 and arm64 do)."""
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")


def is_zero(tensor: torch.Tensor) -> bool:
    """All elements zero, for plain and packed (opaque-layout) tensors alike."""
    return not bool((tensor.to_dense() if tensor.is_mkldnn else tensor).any())


class PackedMatmul:
    """y = x W^T (+ b) for an fp32 W [out, in] held only in oneDNN's packed layout."""

    def __init__(self, weight: torch.Tensor, consume: bool) -> None:
        """``consume``: the weight's memory is ours; zero it once the packed copy exists."""
        if weight.dtype != torch.float32 or weight.device.type != "cpu" or weight.dim() != 2:
            raise PackingError("packed weights are fp32 matrices on the CPU")
        self.out_features, self.in_features = weight.shape
        with torch.inference_mode():
            packed = torch.ops.mkldnn._reorder_linear_weight(weight.contiguous(), PACK_ROWS)
            if torch.ops.mkldnn._nbytes(packed) != packed.numel() * packed.element_size():
                packed.zero_()
                raise PackingError(f"oneDNN pads a {tuple(weight.shape)} weight; it would not wipe as checked")
            if consume:
                weight.zero_()
        self.packed = packed

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        shape = x.shape
        y: torch.Tensor = torch.ops.mkldnn._linear_pointwise(
            x.reshape(-1, self.in_features), self.packed, bias, "none", [], "")
        return y.reshape(*shape[:-1], self.out_features)


def try_pack(weight: torch.Tensor, consume: bool) -> PackedMatmul | None:
    """The packed matmul, or None where this weight cannot be packed (the caller keeps the plain one)."""
    try:
        return PackedMatmul(weight, consume)
    except PackingError:
        return None
