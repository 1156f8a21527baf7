"""Triton kernels are tested on the CPU through the interpreter, against their torch references."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported anywhere in this process

triton = pytest.importorskip("triton", reason="triton is not installed (pip install triton)")


@pytest.fixture
def device() -> str:
    """cpu (the interpreter, in CI); the GPU script runs the same tests with SEALED_KERNEL_DEVICE=cuda
    and TRITON_INTERPRET=0 (tests/gpu/run_gpu_checks.sh)."""
    return os.environ.get("SEALED_KERNEL_DEVICE", "cpu")
