"""Refuse, before decrypting, a package whose weights cannot fit in the memory this worker may use.

The signed manifest names every tensor's dtype and shape, so the least memory the engine will hold can
be known before the first segment is decrypted: the plaintext buffer itself (the CPU path decrypts the
whole package into one buffer) and the weights as the engine's dtype holds them. A lower bound only, so
a model refused here could never have loaded; what the bound misses (the engine's own layouts, its
activations, at least one KV block) is checked exactly once the engine is built (engine/memory.py).
"""

from __future__ import annotations

from pathlib import Path

from enclave_worker.engine.memory import ALLOCATOR_SLACK, MemoryView, check_fits, device_memory, host_memory
from enclave_worker.settings import WorkerSettings
from protocol.package.format import Manifest
from protocol.package.signing import read_manifest

# Bytes per weight the engine's dtype holds at least (quantized: the codes alone, no scales).
_HELD_BYTES = {"float32": 4.0, "bfloat16": 2.0, "float16": 2.0, "int8": 1.0, "fp8": 1.0, "int4": 0.5}
_FLOATS = ("float32", "bfloat16", "float16")


def weights_lower_bound(manifest: Manifest, dtype: str) -> int:
    """The fewest bytes the engine can hold the manifest's weights in at ``dtype``: float tensors at the
    dtype's width; tensors already quantized in the package (integer codes) as they are."""
    per_weight = _HELD_BYTES[dtype]
    total = 0
    for entry in manifest.tensors:
        if entry.dtype in _FLOATS:
            numel = 1
            for dim in entry.shape:
                numel *= dim
            total += int(numel * per_weight)
        else:
            total += entry.nbytes
    return total


def check_package_fits(settings: WorkerSettings, signer: str | None, view: MemoryView | None = None,
                       in_use: int = 0) -> None:
    """ModelDoesNotFit (one line) where the package's plaintext or its weights as held, the fixed KV pool
    (CPU without a utilisation fraction) and the allocator's slack exceed what the worker may use.
    ``view``/``in_use``: the memory to judge against (default: this host's, or the GPU's)."""
    manifest, _, _ = read_manifest(Path(settings.package_dir), required_signer=signer)
    if view is None:
        view, in_use = device_memory(settings.device) if settings.on_gpu else (host_memory(), 0)
    held = weights_lower_bound(manifest, settings.dtype) if settings.engine == "sealed" else 0
    weights = max(manifest.plaintext_bytes, held)
    if settings.on_gpu:
        utilization, kv, what = settings.gpu_memory_utilization, 0, "its weights"
    elif settings.cpu_memory_utilization is None:
        utilization, kv = 1.0, settings.kv_cache_memory_bytes
        what = f"its weights and the {kv / (1 << 20):.0f} MiB KV pool"
    else:
        utilization, kv, what = settings.cpu_memory_utilization, 0, "its weights"
    label = f"{manifest.tenant}/{manifest.model}/{manifest.version} as {settings.dtype}: {what}"
    check_fits(weights + kv + ALLOCATOR_SLACK, label, view, utilization, in_use)
