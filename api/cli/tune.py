"""`sealed tune`: measure the engine's CPU options on this machine, offline, and write an engine tuning file.

The worker never times anything (docs/engine.md, "Kernel paths"): its kernels follow from the device, the
dtype and the CPU class, and its thread count is fixed. What is worth measuring (how many threads, the
C++ decode kernels or torch's) is measured here, once, on a machine of the class the workers will run
on; the tenant then measures the file into the worker's configuration (`--engine-tuning`), so every
worker of that measurement computes alike (enclave_worker/engine_tuning.py).
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import time
from pathlib import Path
from typing import Any

import typer

DEFAULT_PROMPTS = ("The capital of France is", "def fibonacci(n):\n    ", "Once upon a time, in a small village,",
                   "List three prime numbers:", "The quick brown fox", "Water boils at a temperature of")


def candidate_threads(available: int) -> list[int]:
    """1, 2, 4, ... up to every CPU this process may use, and that count itself."""
    counts, n = set(), 1
    while n < available:
        counts.add(n)
        n *= 2
    counts.add(available)
    return sorted(counts)


def _parse_threads(spec: str | None, available: int) -> list[int]:
    if spec is None:
        return candidate_threads(available)
    try:
        counts = sorted({int(part) for part in spec.split(",") if part.strip()})
    except ValueError:
        raise typer.BadParameter(f"--threads must be a comma-separated list of counts, not {spec!r}") from None
    if not counts or counts[0] < 1 or counts[-1] > available:
        raise typer.BadParameter(f"--threads: each count must be in 1..{available} (the CPUs this process may use)")
    return counts


def _load(checkpoint: Path | None) -> Any:
    from enclave_worker.engine import load_gguf
    from enclave_worker.engine.checkpoint import default_gguf_path, load_hf_dir

    path = checkpoint or default_gguf_path()
    return load_hf_dir(path) if path.is_dir() else load_gguf(path)


def decode_rate(checkpoint: Any, config: Any, batch: int, tokens: int, repeat: int) -> float:
    """Median tokens per second of `batch` greedy requests of `tokens` tokens each (after one warm-up)."""
    from enclave_worker.engine import LLMEngine, SamplingParams

    tensors = {k: v.clone() for k, v in checkpoint.tensors.items()}  # an engine consumes its tensors
    engine = LLMEngine.from_checkpoint(dataclasses.replace(checkpoint, tensors=tensors), config)
    params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
    prompts = [engine.tokenizer.encode(DEFAULT_PROMPTS[i % len(DEFAULT_PROMPTS)]) for i in range(batch)]
    rates = []
    for run in range(repeat + 1):
        for i, prompt in enumerate(prompts):
            engine.add_request(f"r{run}-{i}", prompt, params, lambda out: None)
        started = time.perf_counter()
        while engine.has_unfinished_requests():
            engine.step()
        if run:  # the first run warms caches, pools and lazy inits
            rates.append(batch * tokens / (time.perf_counter() - started))
    engine.wipe()  # its compute thread ends when the engine is collected
    return statistics.median(rates)


def tune(
        out: Path = typer.Option(..., "--out", "-o", dir_okay=False, help="the engine tuning file to write"),
        checkpoint: Path = typer.Option(None, exists=True, help="the model to measure with (a GGUF file or a "
                                        "Hugging Face directory; default: the bundled SmolLM2-135M)"),
        dtype: str = typer.Option("float32", help="the dtype the workers will serve"),
        threads: str = typer.Option(None, help="thread counts to try, e.g. 1,2,4 (default: powers of two "
                                    "up to every CPU this process may use)"),
        batch: int = typer.Option(4, min=1, max=64, help="requests decoded together"),
        tokens: int = typer.Option(16, min=1, max=512, help="tokens each request decodes"),
        repeat: int = typer.Option(3, min=1, max=20, help="measured runs per candidate (the median counts)"),
) -> None:
    """Measure thread counts and decode kernels on this CPU; write the fastest as an engine tuning file."""
    from enclave_worker.engine import EngineConfig
    from enclave_worker.engine.config import DTYPES
    from enclave_worker.engine.kernel_path import choose_kernel_path, detect_cpu_class
    from enclave_worker.engine.threads import available_cpus, single_threaded_caller
    from enclave_worker.engine_tuning import EngineTuning

    if dtype not in DTYPES:
        raise typer.BadParameter(f"--dtype must be one of {DTYPES}")
    single_threaded_caller()  # as in the worker: only each engine's compute thread runs a team of threads
    cpu_class = detect_cpu_class()
    counts = _parse_threads(threads, available_cpus())
    model = _load(checkpoint)
    results: list[tuple[float, EngineTuning]] = []
    for kernels in ("auto", "torch"):
        path = choose_kernel_path("cpu", dtype, kernels, cpu_class).name
        for count in counts:
            config = EngineConfig(dtype=dtype, num_threads=count, decode_kernels=kernels, cpu_class=cpu_class,
                                  max_num_seqs=batch, kv_cache_memory_bytes=64 << 20, enable_prefix_caching=False)
            rate = decode_rate(model, config, batch, tokens, repeat)
            results.append((rate, EngineTuning(cpu_class=cpu_class, num_threads=count, decode_kernels=kernels)))
            typer.echo(f"{path:48} threads={count:<3} {rate:9.1f} tokens/s")
    rate, best = max(results, key=lambda result: result[0])
    measured = {"dtype": dtype, "batch": batch, "tokens": tokens, "model": str(checkpoint) if checkpoint else "default",
                "tokens_per_s": [{"num_threads": t.num_threads, "decode_kernels": t.decode_kernels, "rate": round(r, 2)}
                                 for r, t in results]}
    out.write_text(best.to_json(measured))
    typer.echo(json.dumps({"wrote": str(out), "num_threads": best.num_threads, "decode_kernels": best.decode_kernels,
                           "tokens_per_s": round(rate, 2)}))
