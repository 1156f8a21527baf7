"""How much faster OpenBLAS runs this model's dense fp32 matmuls than torch does, and how much faster
again oneDNN runs them over prepacked weights, measured once.

Which library is faster depends on the CPU and the builds: on an AVX2 AMD EPYC, torch's CPU GEMM
(MKL) ran a SmolLM2-135M pass at 64 rows 1.8x slower than numpy's OpenBLAS and at 256 rows 1.55x
slower (`sealed bench linear`, 2026-12-02), so steps of every size belong on OpenBLAS there; on
other hosts the two are closer. ModelRunner.use_blas weighs this measured speedup against the
cost of running attention on one thread (what an OpenBLAS step does). The measurement takes the
model's largest dense layer, both libraries on the same threads, best of a few calls: about 0.1 s
once per process and shape (cached), a small fraction of a model load. On a machine loaded at
that moment the ratio may be off; a wrong routing costs speed, never correctness.

Packed fp32 (layers/packed.py) is a build-time choice: on an AVX-512 Zen 5, oneDNN's packed GEMM ran
the same layer at 64 rows 2.2x faster than OpenBLAS and 2.5x faster than torch (440 against 206 and
175 GFLOP/s, 2026-12-02), and at one row (batch-1 decode) about 15% slower. ``measure_packed_speedup``
gives the 64-row ratio against the better of the two, which the builder weighs (model_builder.py).
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from .threads import ThreadPools

ROWS = (64, 256)  # a decode-sized step and a prefill-sized one
REPEATS = 3


@dataclass(frozen=True)
class BlasSpeedup:
    """torch's time over OpenBLAS's for one dense matmul (> 1: OpenBLAS is faster)."""

    decode: float  # at 64 rows
    prefill: float  # at 256 rows

    @classmethod
    def unmeasured(cls) -> BlasSpeedup:
        """No OpenBLAS path (not fp32 on the CPU): every step stays on torch."""
        return cls(decode=1.0, prefill=1.0)


def _best_seconds(fn: Callable[[], object], repeats: int = REPEATS) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


@contextlib.contextmanager
def _weight_on_threads(out_features: int, in_features: int, threads: int
                       ) -> Iterator[tuple[torch.Generator, torch.Tensor, np.ndarray[Any, Any]]]:
    """A random [out, in] weight in the engine's layout (stored [in, out] contiguous, torch reading it
    through a transposed view, numpy the storage) and its generator, with both pools on ``threads``;
    torch's count is put back after."""
    gen = torch.Generator().manual_seed(0)
    w_t = torch.randn(in_features, out_features, generator=gen) * 0.02
    pools = ThreadPools()
    before = torch.get_num_threads()
    try:
        pools.set(threads, threads)
        yield gen, w_t.t(), w_t.numpy()
    finally:
        pools.set(before, 1)


@functools.cache
def _measure(out_features: int, in_features: int, threads: int) -> BlasSpeedup:
    with _weight_on_threads(out_features, in_features, threads) as (gen, w, w_np):
        xs = [torch.randn(rows, in_features, generator=gen) for rows in ROWS]
        # torch first at every size: OpenBLAS's workers spin for tens of ms after a call and slowed a
        # torch GEMM measured right after it (overstating OpenBLAS's gain, 4.2x against 2.4x at 256 rows).
        t_torch = [_best_seconds(functools.partial(torch.nn.functional.linear, x, w)) for x in xs]
        t_blas = [_best_seconds(functools.partial(np.matmul, x.numpy(), w_np)) for x in xs]
        ratios = [t / max(b, 1e-9) for t, b in zip(t_torch, t_blas, strict=True)]
    return BlasSpeedup(decode=ratios[0], prefill=ratios[1])


@functools.cache
def _measure_packed(out_features: int, in_features: int, threads: int) -> float:
    from .layers.packed import PACK_ROWS, PackedMatmul

    with _weight_on_threads(out_features, in_features, threads) as (gen, w, w_np):
        packed = PackedMatmul(w.contiguous(), consume=False)
        x = torch.randn(PACK_ROWS, in_features, generator=gen)
        x_np = x.numpy()
        # oneDNN first: OpenBLAS's workers spin for tens of ms after a call and would slow oneDNN's
        # threads on a small machine (a measured 4.0 against 0.7 ms on 2 vCPUs).
        t_packed = _best_seconds(lambda: packed(x))
        plain = min(_best_seconds(lambda: torch.nn.functional.linear(x, w)),
                    _best_seconds(lambda: np.matmul(x_np, w_np)))
        return plain / max(t_packed, 1e-9)


def measure_packed_speedup(out_features: int, in_features: int, threads: int) -> float:
    """The better of torch's and OpenBLAS's time over oneDNN's on prepacked fp32 weights, for an [out, in]
    layer at ``PACK_ROWS`` rows on ``threads`` (raises PackingError where this torch cannot pack)."""
    with torch.inference_mode():
        return _measure_packed(out_features, in_features, threads)


def measure_blas_speedup(out_features: int, in_features: int, threads: int) -> BlasSpeedup:
    """torch-over-OpenBLAS time ratios for an [out, in] fp32 weight at ``ROWS`` rows on ``threads``."""
    with torch.inference_mode():
        return _measure(out_features, in_features, threads)
