"""`sealed bench sealed-path`: the worker's CPU per sealed request against the same plaintext request,
in one process (no gateway, no gRPC transport, no client), so other jobs on the machine move it little.

The same prompts go through the worker three ways (`sealed_path.MODES`: the plaintext `Generate` RPC,
the OpenAI layer in the worker unsealed, the `SealedGenerate` RPC), `--requests` at a time up to
`--concurrency`, in `--rounds` rounds whose mode order rotates. Per run: the process's CPU time per
request (engine included), the event loop thread's CPU time per request (the request path outside
the engine's own thread: rendering, policy, OpenAI layer, sealing, signing), the engine steps taken
(equal steps: the engine did the same work) and the in-process time to the first answer byte.
The served, end-to-end cost is `sealed bench serve --sealed`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import threading
import time
from pathlib import Path
from typing import Any

import torch

from enclave_worker.engine import EngineConfig, LLMEngine
from sealed_bench.sealed_path import MODES, PathWorker, Prepared, Timed, bench_state

SCHEMA = "sealed-bench-sealed-path/1"


def load_engine(arch: str, threads: int) -> LLMEngine:
    """SmolLM2-135M-Instruct (the shipped default model, served at fp32) or a random-weight `arch`."""
    from enclave_worker.engine.checkpoint import default_gguf_path, load_gguf
    from sealed_bench.gpu_models import random_checkpoint

    checkpoint = (load_gguf(default_gguf_path()) if arch == "default"
                  else random_checkpoint(arch, "cpu", torch.float32))
    # No prefix cache: every mode prefills the same prompts, so the engine's work is the same.
    return LLMEngine.from_checkpoint(checkpoint, EngineConfig(num_threads=threads, enable_prefix_caching=False))


class StepCounter:
    """Counts the engine's steps (wraps the instance's `step`, which its stepping thread calls)."""

    def __init__(self, engine: LLMEngine) -> None:
        self.steps, self._lock, inner = 0, threading.Lock(), engine.step

        def counted() -> Any:
            with self._lock:
                self.steps += 1
            return inner()

        engine.step = counted  # type: ignore[method-assign]


async def _load(worker: PathWorker, requests: list[Prepared], concurrency: int) -> list[Timed]:
    limit = asyncio.Semaphore(concurrency)

    async def one(p: Prepared) -> Timed:
        async with limit:
            return await worker.answer(p)

    return list(await asyncio.gather(*(one(p) for p in requests)))


def run_mode(worker: PathWorker, steps: StepCounter, mode: str, prompts: list[str], concurrency: int,
             tag: str) -> dict[str, Any]:
    """One run of `prompts` through `mode`; CPU is read in the thread that runs the event loop. The
    gateway's plan (plaintext) and the client's sealing (sealed) are done before the clock starts."""
    n, requests = len(prompts), [worker.prepare(mode, p, f"{tag}-{i}") for i, p in enumerate(prompts)]
    s0, cpu0, loop0, wall0 = steps.steps, time.process_time(), time.thread_time(), time.perf_counter()
    timed = asyncio.run(_load(worker, requests, concurrency))
    cpu, loop, wall = time.process_time() - cpu0, time.thread_time() - loop0, time.perf_counter() - wall0
    return {"mode": mode, "requests": n, "chunks_per_request": statistics.median(t.chunks for t in timed),
            "cpu_ms_per_request": round(1000 * cpu / n, 3), "loop_cpu_ms_per_request": round(1000 * loop / n, 3),
            "engine_steps": steps.steps - s0, "wall_s": round(wall, 3),
            "ttft_ms_p50": round(1000 * statistics.median(t.ttft_s for t in timed), 3)}


def report(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Each mode's medians over its runs, and each mode's cost over plaintext (median - median)."""
    fields = ("cpu_ms_per_request", "loop_cpu_ms_per_request", "engine_steps", "ttft_ms_p50")
    modes = {m: {f: statistics.median(r[f] for r in runs if r["mode"] == m) for f in fields}
             for m in MODES if any(r["mode"] == m for r in runs)}
    base = modes.get("plaintext")
    cost = {m: {f: round(v[f] - base[f], 3) for f in fields} for m, v in modes.items() if m != "plaintext"} \
        if base else {}
    return {"modes": modes, "cost_over_plaintext": cost}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="sealed bench sealed-path", description=__doc__)
    p.add_argument("--arch", default="default", help="'default' (SmolLM2-135M-Instruct, fp32) or a random-weight "
                   "architecture of sealed_bench/gpu_models.py ('tiny': a quick check of the path alone)")
    p.add_argument("--requests", type=int, default=16, help="requests per run")
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--rounds", type=int, default=3, help="runs of each mode (the order rotates each round)")
    p.add_argument("--input-len", type=int, default=128, help="prompt tokens")
    p.add_argument("--output-len", type=int, default=64, help="generated tokens (EOS ignored)")
    p.add_argument("--threads", type=int, default=1, help="engine threads (1: CPU time without spin-waits)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    from sealed_bench.serve_load import load_tokenizer, make_prompts
    from sealed_bench.serve_sealed import _machine

    torch.set_num_threads(args.threads)
    engine = load_engine(args.arch, args.threads)
    worker, steps = PathWorker(bench_state(engine), args.output_len), StepCounter(engine)
    prompts = make_prompts(args.requests, args.input_len, args.seed, load_tokenizer(None))
    for mode in MODES:  # warm-up: first-call costs (allocations, imports, kernels) out of the figures
        run_mode(worker, steps, mode, prompts[:args.concurrency], args.concurrency, f"warm-{mode}")
    runs = []
    for r in range(args.rounds):
        for mode in MODES[r % len(MODES):] + MODES[:r % len(MODES)]:
            run = run_mode(worker, steps, mode, prompts, args.concurrency, f"{mode}-{r}")
            print(f"round {r + 1}/{args.rounds} {mode:9s} CPU {run['cpu_ms_per_request']:9.1f} ms/request  "
                  f"event loop {run['loop_cpu_ms_per_request']:7.2f} ms/request  steps {run['engine_steps']}  "
                  f"TTFT p50 {run['ttft_ms_p50']:8.1f} ms")
            runs.append({"round": r + 1, **run})
    out = {"schema": SCHEMA, "conditions": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()
                                            if k != "json"},
           "machine": _machine(), "date": time.strftime("%Y-%m-%d", time.gmtime()), "runs": runs, **report(runs)}
    for mode, c in out["cost_over_plaintext"].items():
        print(f"{mode} - plaintext (medians): CPU {c['cpu_ms_per_request']:+.2f} ms/request, event loop "
              f"{c['loop_cpu_ms_per_request']:+.2f} ms/request, steps {c['engine_steps']:+}, "
              f"TTFT p50 {c['ttft_ms_p50']:+.2f} ms")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
