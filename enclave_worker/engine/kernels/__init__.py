"""GPU kernels (Triton) for the engine, each with a plain-torch reference of the same signature.

Triton kernels run on CUDA tensors, and on the CPU under `TRITON_INTERPRET=1` (how CI tests them
against the references). `triton_enabled(tensor)` says whether a call on that tensor takes the
Triton path; otherwise callers use the reference (today's CPU path keeps its own ops).
"""

from __future__ import annotations

import functools
import importlib.util
import os

import torch


@functools.cache
def triton_installed() -> bool:
    return importlib.util.find_spec("triton") is not None


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def triton_enabled(tensor: torch.Tensor) -> bool:
    """Triton runs on CUDA tensors, and on CPU tensors only under the interpreter (tests)."""
    if not triton_installed():
        return False
    return tensor.is_cuda or (interpreting() and tensor.device.type == "cpu")
