"""CPU kernels in C++: paged decode attention reading K/V in place, and the per-layer elementwise
work fused (residual add + RMSNorm, rotary + KV-cache write, SiLU-and-mul). Each has a torch
equivalent in layers/ that the engine runs under `decode_kernels="torch"` (and for quantized models),
and that the tests compare against.

Decode attention: one query token per sequence, K/V read in place from the block pool.

The torch path (layers/attention.py) gathers every sequence's blocks into a fresh [B, Hkv, L, D]
tensor, copies it again into the layout a batched matmul wants, and runs two matmuls per layer
(nearly half a bf16 decode step at large batches: docs/benchmarks-history.md, "Figures moved from
engine docstrings"). This kernel walks each sequence's block table and reads K and V rows
where they lie: one pass over K, one over V, fp32 accumulation, a max-subtracted softmax, one task
per sequence (all its KV heads) on torch's own thread pool (at::parallel_for: no second OpenMP runtime).

The elementwise kernels replace 5-7 torch ops each (float conversions, pow, mean, rsqrt, roll, ...):
a batch-1 decode step dispatches ~900 small ops.

The C++ source is cpu_ops.cpp. It is compiled when the project is installed (setup.py: a torch
CppExtension, `-march=native` unless the build names another instruction set; cpu_build.py) into
the package as `_cpu_ops`, and never at run time: a worker runs no compiler and writes no build
cache. `load_cpu_ops` loads the installed module and checks the record the build embedded against
this package's source, torch and CPU; a missing, unloadable or stale module is a one-line
CpuKernelsUnavailable, never a silent fallback or a wait. The loaded module's bytes are part of the
worker's measurement (enclave_worker/measurement.py measures extension modules of its closure).
Every block index, slot and length is checked against the pool before any row is read or written.
"""

from __future__ import annotations

import functools
import importlib
import importlib.machinery
from pathlib import Path
from types import ModuleType

import torch

from ..errors import CpuKernelsUnavailable
from .cpu_build import DIGEST_NAME, MODULE_NAME, build_record, decode_record, digest_line, read_sources

REBUILD = "build them: `make install`, or `pip install --no-build-isolation -e .` after torch (docs/engine.md)"


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _check_complete(package: Path) -> None:
    """The module Python would load (this interpreter's suffixes, in its finder's order) is there, and is
    the file the build finished: its digest, written after it, matches. Checked before it is loaded."""
    candidates = [package / (MODULE_NAME + suffix) for suffix in importlib.machinery.EXTENSION_SUFFIXES]
    module = next((path for path in candidates if path.is_file()), None)
    if module is None:
        raise CpuKernelsUnavailable(f"the CPU kernels are not built (no {MODULE_NAME}.*.so in {package}); {REBUILD}")
    try:
        recorded = (package / DIGEST_NAME).read_text()
    except OSError:
        recorded = ""
    if recorded != digest_line(module):
        raise CpuKernelsUnavailable(f"the CPU kernel build is incomplete or altered ({module.name} does not match "
                                    f"{DIGEST_NAME}: an interrupted build?); {REBUILD}")


@functools.cache
def load_cpu_ops() -> ModuleType:
    """The kernel module built when the project was installed (setup.py), checked against what it must
    have been built from: this package's cpu_ops.cpp and cpu_linear.cpp, the flags, the torch in this process and, for a
    -march=native build, this CPU. Never compiles anything. Raises CpuKernelsUnavailable (one line:
    what is wrong and how to build them) where the module is missing, does not load or is stale."""
    _check_complete(Path(__file__).parent)
    try:
        # A static import, so the worker's measured import closure (measurement.py) includes the
        # compiled module's bytes; mypy has no source for it.
        from . import _cpu_ops  # type: ignore[attr-defined]
    except ImportError as exc:  # built for another Python or against another libtorch, ...
        raise CpuKernelsUnavailable(f"the CPU kernels do not load ({_one_line(str(exc))}); {REBUILD}") from exc
    try:
        built = decode_record(_cpu_ops.build_info())
        source = read_sources(Path(__file__).parent)
    except (AttributeError, ValueError, OSError) as exc:
        raise CpuKernelsUnavailable(f"the CPU kernels carry no readable build record or a source is missing "
                                    f"({type(exc).__name__}); {REBUILD}") from exc
    expected = build_record(source, torch.__version__, str(built.get("march")))
    stale = [key for key in sorted(expected) if built.get(key) != expected[key]]
    if stale:
        raise CpuKernelsUnavailable(f"the CPU kernels are stale: built with another {', '.join(stale)} "
                                    f"({_cpu_ops.__file__}); {REBUILD}")
    return _cpu_ops


def _ops() -> ModuleType:
    return load_cpu_ops()


def paged_decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                           context_lens: torch.Tensor, block_size: int, scale: float) -> torch.Tensor:
    """q [B, H, D]; caches [slots, Hkv, D]; tables [B, max_blocks] int64; lens [B] int64 -> [B, H, D]."""
    out: torch.Tensor = _ops().paged_decode_attention(q, k_cache, v_cache, block_tables, context_lens, block_size,
                                                      scale)
    return out


def add_rms_norm(x: torch.Tensor | None, residual: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm of ``residual + x`` (``residual`` updated in place to that sum); of ``residual`` alone when x is None."""
    out: torch.Tensor = _ops().add_rms_norm(residual if x is None else x, residual, weight, eps, x is not None)
    return out


def rope_and_cache(qkv: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor, slot_mapping: torch.Tensor,
                   k_cache: torch.Tensor, v_cache: torch.Tensor, heads: int, kv_heads: int) -> None:
    """Rotate q and k inside ``qkv`` [T, (H + 2 Hkv) D] in place; write k and v to the caches at their slots."""
    _ops().rope_and_cache(qkv, cos, sin_signed, slot_mapping, k_cache, v_cache, heads, kv_heads)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """[T, 2I] (gate | up) -> silu(gate) * up, [T, I]."""
    out: torch.Tensor = _ops().silu_and_mul(x)
    return out
