"""One timed vLLM model load, run in vLLM's virtualenv by `sealed bench vllmload` (a fresh process per load).

`sealed PKG` (the data key on stdin, hex): decrypt the package into memory and build vLLM's engine
with our loader. `plain DIR`: build vLLM's engine from a plaintext safetensors directory with its
own loader. Prints one JSON line: seconds for the decryption, the engine build and both.
An optional third argument, JSON `{"bind": ..., "reserved": ...}`, is the CPU binding both sides
give vLLM (enclave_worker/vllm_cpu_binding.py; default: every CPU, none reserved).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

OPTIONS: dict[str, Any] = dict(max_model_len=1024, max_num_seqs=8, kv_cache_memory_bytes=64 << 20)


def _import_vllm() -> None:
    """vLLM's import (tens of seconds on a loaded machine) is outside both timings: the worker
    imports it while it attests, and the reference has it imported before its clock starts. The
    same modules on both sides: the loader registry (which the sealed side imports to register
    its loader before the clock) was imported inside the plain side's clock only, ~0.3 s in the
    sealed side's favour, until 2026-12-01."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    import vllm.engine.arg_utils
    import vllm.model_executor.model_loader
    import vllm.v1.engine.llm_engine  # noqa: F401


def _binding(spec: str | None) -> Any:
    from enclave_worker.vllm_cpu_binding import VllmCpuBinding

    return VllmCpuBinding(**json.loads(spec)) if spec else VllmCpuBinding()


def sealed(pkg: Path, key: bytes, bind: str | None = None) -> dict[str, float]:
    _import_vllm()
    from enclave_worker.package import decrypt_package
    from enclave_worker.vllm_engine import loader
    from enclave_worker.vllm_engine.runtime import VllmOptions, VllmRuntime

    loader.register()
    started = time.perf_counter()
    model = decrypt_package(pkg, key)
    decrypted = time.perf_counter()
    runtime = VllmRuntime(model.metadata["config"], lambda: model, VllmOptions(**OPTIONS, cpu_binding=_binding(bind)))
    done = time.perf_counter()
    runtime.close()
    return {"decrypt_s": decrypted - started, "engine_s": done - decrypted, "total_s": done - started}


def plain(model_dir: Path, bind: str | None = None) -> dict[str, float]:
    from enclave_worker import vllm_cpu_binding as binding

    binding.apply(_binding(bind))  # as the sealed side's runtime does, before vLLM builds its worker
    _import_vllm()
    from vllm.engine.arg_utils import EngineArgs
    from vllm.v1.engine.llm_engine import LLMEngine

    started = time.perf_counter()
    llm = LLMEngine.from_engine_args(EngineArgs(
        model=str(model_dir), skip_tokenizer_init=True, load_format="safetensors", dtype="float32",
        enforce_eager=True, enable_prefix_caching=True, seed=0, **OPTIONS), enable_multiprocessing=False)
    done = time.perf_counter()
    llm.engine_core.shutdown()
    return {"decrypt_s": 0.0, "engine_s": done - started, "total_s": done - started}


def main(argv: list[str]) -> int:
    mode, path, *rest = argv
    bind = rest[0] if rest else None
    result = (sealed(Path(path), bytes.fromhex(sys.stdin.readline().strip()), bind) if mode == "sealed"
              else plain(Path(path), bind))
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
