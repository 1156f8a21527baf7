"""Dense fp32 weights held in column panels for the C++ kernel that streams them once per call
(the fp32 CPU path, kernel_path.py; kernels/cpu_linear.cpp).

A decode step multiplies a handful of rows (its batch) by every weight: it is bound by reading the
weights, and each weight should cross the memory bus once per step (docs/engine.md, "fp32 weights in
column panels", has the measurements). Held as panels [N / NR, K, NR] (NR outputs, every K, contiguous),
one layer is one front-to-back stream per thread, and the kernel keeps each row's NR outputs in a
register across K. Threads split the panels, so each output is computed by one thread in one order: the
result does not depend on the thread count. The panels are the layer's one plaintext copy: the source
matrix is rearranged in its own memory when the caller hands it over (a decrypted package's buffer then
holds the panels), and the panels are a plain tensor that ``LLMEngine.wipe`` zeroes like any other
weight.
"""

from __future__ import annotations

import torch

from ..kernels.cpu_ops import load_cpu_ops

# With the AVX2 / portable kernel (NR = 8), from this many rows (a prefill chunk) the layer is unpacked
# into W^T's plain [in, out] layout for the call and multiplied by torch's GEMM: a prefill is
# compute-bound, and that kernel's two-panel tile (6 rows x 16 outputs) ran it below torch's blocked
# GEMM on a Zen 3 (docs/engine.md, "fp32 weights in column panels"). The AVX-512 kernel (NR = 16)
# takes every call: its 12 x 32 tile ran prefill-sized calls faster than the unpack and the GEMM
# together on a Zen 4 (1.15-1.35x at 128-512 rows, same docs), and one kernel for every row count
# keeps a row's result independent of the rows beside it, a prefill's included.
GEMM_MIN_ROWS = 128


def gemm_min_rows(width: int) -> int | None:
    """From how many rows a panel layer of this kernel width goes through the unpacked GEMM; None: never.
    The width is the build's (-march, so the CPU class's): the same class, the same rule."""
    return None if width >= 16 else GEMM_MIN_ROWS


class UnpackScratch:
    """One model's buffer for the unpacked layer of a prefill-sized call, reused by every panel layer.

    A fresh [in, out] buffer per call adds page faults on first touch and a zeroing pass before the
    memory goes back to the allocator (docs/engine.md, "fp32 weights in column panels"). The buffer
    holds the last unpacked layer's W^T, plaintext like the panels themselves, and is a held tensor of
    the model (models.model_tensors finds it as an attribute of the model's helper): ``LLMEngine.wipe``
    zeroes it with the weights. Layers above ``max_bytes`` (a tied LM head) take a fresh buffer, zeroed
    after the call. One step runs at a time (the engine's step lock), so one buffer serves every layer."""

    def __init__(self, max_bytes: int = 64 << 20) -> None:
        self.max_bytes = max_bytes
        self.buffer = torch.empty(0, dtype=torch.float32)

    def take(self, rows: int, cols: int) -> torch.Tensor | None:
        """A [rows, cols] fp32 view of the buffer (grown if needed), or None above ``max_bytes``."""
        need = rows * cols
        if need * 4 > self.max_bytes:
            return None
        if self.buffer.numel() < need:
            old, self.buffer = self.buffer, torch.empty(need, dtype=torch.float32)
            old.zero_()  # the smaller buffer's last layer, before its memory goes back to the allocator
        return self.buffer[:need].view(rows, cols)


class PanelMatmul:
    """y = x W^T for an fp32 W [out, in] on the CPU, held only as panels (module doc)."""

    def __init__(self, weight: torch.Tensor, consume: bool, scratch: UnpackScratch | None = None) -> None:
        """``consume``: the weight's memory is ours; the panels are written into it. ``scratch``: the
        model's buffer for prefill-sized calls' unpacked layer (UnpackScratch); without it each such
        call allocates its own."""
        ops = load_cpu_ops()
        self.scratch = scratch
        nr = int(ops.panel_width())
        n, k = weight.shape
        self.out_features, self.in_features, self.width = n, k, nr
        self.gemm_min_rows = gemm_min_rows(nr)  # the build's rule (module doc); tests may set another
        self._ops = ops
        with torch.inference_mode():
            if consume and weight.is_contiguous():
                tmp = weight.clone()
                panels = weight.view(n // nr, k, nr)  # the same memory, reinterpreted
                panels.copy_(tmp.view(n // nr, nr, k).transpose(1, 2))
                tmp.zero_()  # the transient plaintext copy: zeroed before it goes back to the allocator
                del tmp
            else:
                panels = weight.reshape(n // nr, nr, k).transpose(1, 2).contiguous()
        self.panels = panels

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        shape = x.shape
        x2 = x.reshape(-1, self.in_features)
        gemm = self.gemm_min_rows is not None and x2.shape[0] >= self.gemm_min_rows
        y = self._unpacked_gemm(x2) if gemm else self._kernel(x2.contiguous())
        if bias is not None:
            y.add_(bias)
        return y.reshape(*shape[:-1], self.out_features)

    def _unpacked_gemm(self, x2: torch.Tensor) -> torch.Tensor:
        """x W^T through W^T unpacked for this call, into the model's scratch buffer; a transient
        buffer of its own (no scratch, or a layer above the scratch's size) is zeroed before its
        memory goes back to the allocator, whatever happens in between."""
        n, k = self.out_features, self.in_features
        w_t = None if self.scratch is None else self.scratch.take(k, n)
        transient = w_t is None
        if w_t is None:
            w_t = torch.empty(k, n, dtype=torch.float32)
        try:
            self._unpack_into(w_t)
            return torch.mm(x2, w_t)
        finally:
            if transient:
                w_t.zero_()

    def _kernel(self, x2: torch.Tensor) -> torch.Tensor:
        """x W^T through the panel kernel (x2 contiguous): every call below ``gemm_min_rows``."""
        y: torch.Tensor = self._ops.panel_linear(x2, self.panels)
        return y

    def _unpack_into(self, w_t: torch.Tensor) -> None:
        self._ops.panel_unpack(self.panels, w_t)

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """W's rows ``ids`` [T] -> [T, in] (a tied embedding's lookup from its head's panels)."""
        return self.panels[ids // self.width, :, ids % self.width]


def try_panel(weight: torch.Tensor, consume: bool, scratch: UnpackScratch | None = None) -> PanelMatmul | None:
    """The panel matmul, or None where this weight does not fit it (not an fp32 CPU matrix, or its
    output count not a multiple of the kernel's panel width; it keeps the plain layout). Raises
    CpuKernelsUnavailable where the kernels are not built: asking for panels is asking for them."""
    if weight.dtype != torch.float32 or weight.device.type != "cpu" or weight.dim() != 2:
        return None
    nr = int(load_cpu_ops().panel_width())
    if weight.shape[0] % nr or weight.shape[0] == 0:
        return None
    return PanelMatmul(weight, consume, scratch)
