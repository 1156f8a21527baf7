"""The machine's rates a decode step's bound is computed from (decode_bound.py): copy bandwidth and
fp32 matmul FLOP rate, each the best of a few repeats, measured in the benchmark's own process with
torch's default threads (every core torch sees)."""

from __future__ import annotations

import time
from collections.abc import Callable


def _best(fn: Callable[[], object], repeats: int) -> float:
    fn()  # first touch, thread pool start
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - started)
    return best


def copy_bandwidth_gbs(size_mb: int = 256, repeats: int = 5) -> float:
    """Bytes read + written per second (GB/s) by a copy of a buffer far larger than the caches."""
    import torch

    src = torch.ones(size_mb << 18, dtype=torch.float32)
    dst = torch.empty_like(src)
    return 2 * src.nbytes / _best(lambda: dst.copy_(src), repeats) / 1e9


def matmul_gflops(n: int = 2048, repeats: int = 3) -> float:
    """fp32 GFLOP/s of an n x n by n x n matmul (2 n^3 FLOPs)."""
    import torch

    a = torch.randn(n, n, dtype=torch.float32)
    b = torch.randn(n, n, dtype=torch.float32)
    out = torch.empty(n, n, dtype=torch.float32)
    return 2 * n**3 / _best(lambda: torch.mm(a, b, out=out), repeats) / 1e9
