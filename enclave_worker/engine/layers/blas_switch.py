"""The per-model switch that routes a step's dense fp32 matmuls to OpenBLAS (its own module: both
the dense and the panel layers read it, and neither imports the other for it)."""

from __future__ import annotations


class BlasSwitch:
    """Per-model flag the runner sets for each step: route dense fp32 matmuls to OpenBLAS or not.

    Small steps (decode of up to a few dozen sequences) are memory-bound matrix-vector-like
    products, where numpy's OpenBLAS streams the weights up to twice as fast as torch's CPU BLAS
    (docs/engine.md). Its thread pool and torch's OpenMP pool must not both be busy (their
    spinning workers stall each other, 10x slower), so the runner turns this on only together
    with running torch on one thread for that step.
    """

    __slots__ = ("enabled",)

    def __init__(self) -> None:
        self.enabled = False
