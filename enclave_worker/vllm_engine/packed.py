"""oneDNN-prepacked linear weights that the revocation wipe reaches (docs/vllm-backend.md, "Revocation").

On the CPU, vLLM re-packs each linear weight for oneDNN into a handle whose memory C++ owns: no
tensor reaches it, so a wipe could not zero it. Here the same re-layout is made by torch's own
oneDNN binding into an MKLDNN tensor instead: still oneDNN's blocked layout and matmul, but a torch
tensor whose address and byte size torch reports, so `zero_every_byte` zeroes all of it (blocked
layouts may pad; the padding is zeroed too). The layer's dense weight is zeroed and released
right after its pack is made, as vLLM releases it (unzeroed) in its own dispatch.
"""

from __future__ import annotations

import ctypes
import functools

import torch

from enclave_worker.engine.layers.packed import zero_every_byte as zero_every_byte  # one wipe for both engines

# The batch oneDNN chooses the packed layout for; vLLM packs for 32 as well (layers/utils.py).
PACK_BATCH = 32
_ATTR = "_sealed_packed_weight"


def _packed_linear(packed: torch.Tensor, x: torch.Tensor, weight: torch.Tensor,
                   bias: torch.Tensor | None) -> torch.Tensor:
    out: torch.Tensor = torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")
    return out


def pack_linear(layer: torch.nn.Module, *, release_dense: bool) -> torch.Tensor | None:
    """`layer.cpu_linear` (what vLLM's CPU linear and LM head call) becomes oneDNN's matmul over a
    packed copy of `layer.weight`. With `release_dense`, the weight parameter becomes empty and the
    dense weight is zeroed here, right after its pack exists, and returned (the caller drops its
    last references, so its memory is freed before the next layer's pack is allocated, as vLLM's
    own dispatch frees it). An embedding used as LM head keeps its weight (the lookup reads it)."""
    weight = layer.weight
    assert isinstance(weight, torch.Tensor)
    packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), PACK_BATCH)
    setattr(layer, _ATTR, packed)
    layer.cpu_linear = functools.partial(_packed_linear, packed)  # type: ignore[assignment]  # vLLM's hook
    if not release_dense:
        return None
    layer.weight = torch.nn.Parameter(torch.empty(0, dtype=weight.dtype), requires_grad=False)
    weight.data.zero_()
    return weight.data


def packed_tensors(model: torch.nn.Module) -> list[torch.Tensor]:
    return [getattr(m, _ATTR) for m in model.modules() if hasattr(m, _ATTR)]


def nbytes(tensor: torch.Tensor) -> int:
    """Bytes of the tensor's memory (for an MKLDNN tensor, oneDNN's size, padding included)."""
    if tensor.is_mkldnn:
        return int(torch.ops.mkldnn._nbytes(tensor))
    return tensor.numel() * tensor.element_size()


def raw_bytes(tensor: torch.Tensor) -> bytes:
    """A copy of every byte of the tensor's memory (tests check a wipe with it)."""
    address = torch.ops.mkldnn.data_ptr(tensor) if tensor.is_mkldnn else tensor.data_ptr()
    return ctypes.string_at(address, nbytes(tensor))


