"""Where a `sealed bench vllmload` load spends its time: one probe load with its phases timed.

Run in vLLM's virtualenv, one load per process, like the probe (docs/benchmarks.md, "vLLM engine"):

    PYTHONPATH=. $SEALED_VLLM_PYTHON -m sealed_bench.vllm_load_phases sealed PKG < key.hex
    PYTHONPATH=. $SEALED_VLLM_PYTHON -m sealed_bench.vllm_load_phases plain DIR

Wall seconds (time.perf_counter) around vLLM's and our functions, summed per phase, and every
gc.collect() call: a profiler's own overhead (cProfile) inflates vLLM's Python-heavy build several
times over, so only the functions named here are wrapped. Prints one JSON line.
"""

from __future__ import annotations

import functools
import gc
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sealed_bench import vllm_load_probe as probe


def _timed(totals: dict[str, Any], label: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            totals[label] = totals.get(label, 0.0) + time.perf_counter() - started
    return wrapper


def _wrap(totals: dict[str, Any]) -> None:
    import vllm.model_executor.model_loader.base_loader as base_loader
    import vllm.model_executor.models.llama as llama
    import vllm.v1.engine.core as core
    import vllm.v1.worker.cpu_worker as cpu_worker

    import enclave_worker.package.reader as reader
    from enclave_worker.vllm_engine import loader

    for owner, name, label in (
        (reader, "_torch_allocate", "sealed: allocate decrypted buffer"),
        (reader, "decrypt_stream", "sealed: AES-GCM + BLAKE3"),
        (base_loader.BaseModelLoader, "create_model", "create_model"),
        (llama.LlamaForCausalLM, "load_weights", "model.load_weights"),
        (base_loader, "process_weights_after_loading", "vLLM process_weights_after_loading"),
        (loader, "pack_cpu_weights", "sealed: pack_cpu_weights"),
        (cpu_worker.CPUWorker, "load_model", "worker.load_model"),
        (cpu_worker.CPUWorker, "compile_or_warm_up_model", "warm-up"),
        (core.EngineCore, "_initialize_kv_caches", "KV cache"),
    ):
        setattr(owner, name, _timed(totals, label, getattr(owner, name)))
    collect = gc.collect

    def timed_collect(generation: int = 2) -> int:
        started = time.perf_counter()
        freed = collect(generation)
        totals.setdefault("gc.collect calls", []).append(round(time.perf_counter() - started, 3))
        return freed
    gc.collect = timed_collect  # vLLM calls gc.collect() as a module attribute


def main(argv: list[str]) -> int:
    mode, path = argv
    probe._import_vllm()
    totals: dict[str, Any] = {}
    _wrap(totals)
    if mode == "sealed":
        result = probe.sealed(Path(path), bytes.fromhex(sys.stdin.readline().strip()))
    else:
        result = probe.plain(Path(path))
    # A sealed load's last gc.collect call is its engine's close, after the probe's clock stopped.
    print(json.dumps({"mode": mode, **{k: round(v, 3) for k, v in result.items()},
                      **{k: (round(v, 3) if isinstance(v, float) else v) for k, v in totals.items()}}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
