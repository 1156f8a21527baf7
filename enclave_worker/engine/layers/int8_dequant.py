"""x W^T for a per-output-channel int8 weight and a batch of rows, through float slices of W.

The aten int8 kernel loops over rows, so from ``DEQUANT_MIN_ROWS`` rows on the int8 layers (linear.py's
Int8Linear, quantized_linear.py's PrequantizedInt8Linear) multiply by W dequantized to float. Dequantized
whole, a 1B model's decode step at batch 16 wrote and read a fresh float copy of every weight: on the
2-vCPU Zen 5 VM an 8192x2048 layer took 36.5 ms at 16 rows, and the step 2.6 s (docs/engine.md,
"Quantization"). Here W is dequantized a slice of output rows at a time into one reused buffer of a few
MiB (it stays in cache, no page faults), each slice multiplied as it is made: 7.9 ms for that layer (4.6x),
the same weights, and outputs equal to the whole matrix's up to the GEMM's own blocking (bit-equal in that
measurement; each output is still one dot product over all of K).
"""

from __future__ import annotations

import torch

DEQUANT_MIN_ROWS = 16  # from this many rows the int8 weight is dequantized per call (the aten kernel loops over rows)
SLICE_BYTES = 4 << 20  # the float slice's size: 1 MiB slices cost more calls, 16 MiB ones fall out of cache


def dequantized_matmul(x2: torch.Tensor, qweight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x2 [M, K] @ (qweight [N, K] int8 * scale [N])^T in x2's dtype; the slice buffer (plaintext
    weights) is zeroed before its memory goes back to the allocator."""
    if x2.device.type != "cpu":  # a GPU's GEMM wants the whole matrix; its memory is not the bottleneck
        return torch.nn.functional.linear(x2, qweight.to(x2.dtype) * scale[:, None])
    n, k = qweight.shape
    step = min(n, max(16, SLICE_BYTES // (x2.element_size() * k) // 16 * 16))
    y = torch.empty(x2.shape[0], n, dtype=x2.dtype, device=x2.device)
    buffer = torch.empty(step, k, dtype=x2.dtype, device=x2.device)
    try:
        for start in range(0, n, step):
            stop = min(start + step, n)
            w = buffer[: stop - start]
            torch.mul(qweight[start:stop], scale[start:stop, None], out=w)
            y[:, start:stop] = x2 @ w.T
    finally:
        buffer.zero_()
    return y
