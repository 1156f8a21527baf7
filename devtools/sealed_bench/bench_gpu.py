"""`sealed bench gpu` (also `sealed bench engine --device cuda`): our engine on a GPU against HF
transformers in the same run, on a random-weight model of a named architecture.

Reports per batch: output tok/s (all tokens / wall time, prefill included), decode tok/s, TTFT, and
host<->device crossings per decode step (the engine's count, checked with the CUDA profiler); the
bandwidth bound it measures (read bandwidth of a device copy / weight bytes per token); HF eager and
HF with a static cache + torch.compile; int4 / FP8 at batch 1; greedy equality with HF in fp32.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import time
from pathlib import Path
from typing import Any

import torch

from enclave_worker.engine import EngineConfig, LLMEngine, RequestOutput, SamplingParams
from enclave_worker.engine.output_stream import Sink
from sealed_bench.gpu_models import ARCHS, hf_model, random_checkpoint

DTYPES = {"bf16": ("bfloat16", torch.bfloat16), "fp32": ("float32", torch.float32),
          "int4": ("int4", torch.bfloat16), "fp8": ("fp8", torch.bfloat16)}


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def read_bandwidth(device: str, nbytes: int = 2 << 30) -> float:
    """Bytes read per second by a device-to-device copy (it reads and writes nbytes each)."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    times = []
    for _ in range(6):
        sync()
        t = time.perf_counter()
        dst.copy_(src)
        sync()
        times.append(time.perf_counter() - t)
    del src, dst
    return nbytes / sorted(times)[len(times) // 2]


def prompts(batch: int, length: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(100, 40000, (batch, length), generator=g).tolist()


def _note_first(firsts: dict[str, float], request_id: str) -> Sink:
    """A sink that notes when the request's first output came."""
    def sink(_: RequestOutput | BaseException) -> None:
        firsts.setdefault(request_id, time.perf_counter())
    return sink


def _collect(tokens: list[int]) -> Sink:
    """A sink that appends the request's tokens (an engine error is raised where it arrives)."""
    def sink(output: RequestOutput | BaseException) -> None:
        if isinstance(output, BaseException):
            raise output
        tokens.extend(output.delta_token_ids)
    return sink


def run_sealed(engine: LLMEngine, batch: list[list[int]], out_len: int) -> dict[str, Any]:
    firsts: dict[str, float] = {}
    params = SamplingParams(max_tokens=out_len, temperature=0, ignore_eos=True)
    crossings0 = engine.runner.transfers.total()
    sync()
    start = time.perf_counter()
    for i, p in enumerate(batch):
        engine.add_request(f"r{i}", p, params, _note_first(firsts, f"r{i}"))
    steps = 0
    while engine.has_unfinished_requests():
        engine.step()
        steps += 1
    sync()
    end = time.perf_counter()
    first = max(firsts.values())
    decode_steps = out_len - 1
    return {"tok_s": len(batch) * out_len / (end - start),
            "decode_tok_s": len(batch) * (out_len - 1) / max(end - first, 1e-9),
            "ttft_ms": (min(firsts.values()) - start) * 1000, "steps": steps,
            "crossings_per_decode_step": (engine.runner.transfers.total() - crossings0) / max(decode_steps, 1)}


def profiled_crossings(engine: LLMEngine, prompt: list[int]) -> dict[str, int]:
    """Memcpy HtoD / DtoH seen by the CUDA profiler during decode steps of one request (prefill excluded)."""
    from torch.profiler import ProfilerActivity, profile

    engine.add_request("p", prompt, SamplingParams(max_tokens=6, temperature=0, ignore_eos=True), lambda o: None)
    engine.step()  # prefill
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        for _ in range(4):
            engine.step()
        sync()
    while engine.has_unfinished_requests():
        engine.step()
    names = [e.name for e in prof.events()]
    return {"decode_steps": 4, "memcpy_htod": sum("HtoD" in n for n in names),
            "memcpy_dtoh": sum("DtoH" in n for n in names)}


def run_hf(model: Any, batch: list[list[int]], out_len: int, static: bool) -> dict[str, Any]:
    ids = torch.tensor(batch, device=model.device)
    kwargs: dict[str, Any] = {"max_new_tokens": out_len, "min_new_tokens": out_len, "do_sample": False,
                              "pad_token_id": 0}
    if static:
        kwargs["cache_implementation"] = "static"
        # Compile outside the timing, at the timed run's shapes: a shorter warm-up sizes the static cache
        # differently and the timed run recompiles (2.7 tok/s at batch 1 on the H200 that way).
        model.generate(ids, **kwargs)
    sync()
    start = time.perf_counter()
    model.generate(ids, **kwargs)
    sync()
    return {"tok_s": len(batch) * out_len / (time.perf_counter() - start)}


def make_engine(checkpoint: Any, dtype: str, max_seqs: int, max_len: int, device: str,
                decode_kernels: str = "auto", cuda_graphs: bool | None = None) -> LLMEngine:
    tensors = {k: v.clone() for k, v in checkpoint.tensors.items()}
    cfg = EngineConfig(device=device, dtype=dtype, max_num_seqs=max_seqs, max_num_batched_tokens=16384,
                       max_model_len=max_len, kv_cache_memory_bytes=4 << 30, enable_prefix_caching=False,
                       decode_kernels=decode_kernels, cuda_graphs=cuda_graphs)
    return LLMEngine.from_checkpoint(dataclasses.replace(checkpoint, tensors=tensors), cfg)


def greedy_equality(arch: str, device: str, assets: Path | None, n_prompts: int = 8, n_tokens: int = 32,
                    decode_kernels: str = "auto", cuda_graphs: bool | None = None) -> dict:
    ck = random_checkpoint(arch, device, torch.float32, assets, seed=1, head_std=1.0)
    hf = hf_model(ck, device, torch.float32)
    engine = make_engine(ck, "float32", n_prompts, 256, device, decode_kernels, cuda_graphs)
    batch = prompts(n_prompts, 16, seed=2)
    params = SamplingParams(max_tokens=n_tokens, temperature=0, ignore_eos=True)
    outs: dict[str, list[int]] = {f"r{i}": [] for i in range(n_prompts)}
    for i, p in enumerate(batch):
        engine.add_request(f"r{i}", p, params, _collect(outs[f"r{i}"]))
    while engine.has_unfinished_requests():
        engine.step()
    ref = hf.generate(torch.tensor(batch, device=device), max_new_tokens=n_tokens, min_new_tokens=n_tokens,
                      do_sample=False, pad_token_id=0)[:, 16:].tolist()
    equal = sum(outs[f"r{i}"] == ref[i] for i in range(n_prompts))
    return {"prompts": n_prompts, "tokens": n_tokens, "equal": equal}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="sealed bench gpu", description=__doc__)
    ap.add_argument("--arch", default="tinyllama-1.1b", choices=sorted(ARCHS))
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--batch", default="1,64,256")
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--quant", default="int4,fp8", help="quantized dtypes measured at batch 1")
    ap.add_argument("--compare", default="hf,hf-compile", help="hf (eager), hf-compile (static cache + compile)")
    ap.add_argument("--compile-batches", default="1,64", help="batches for hf-compile (each compiles)")
    ap.add_argument("--only-peers", action="store_true", help="skip our engine's rows (a peer-only rerun)")
    ap.add_argument("--check-hf", action="store_true", help="greedy fp32 equality with HF (8 prompts x 32 tokens)")
    ap.add_argument("--assets", type=Path, default=None, help="tokenizer assets (see tests/gpu/README.md)")
    ap.add_argument("--json", type=Path, default=None)
    # EngineConfig's defaults: "auto" is the Triton kernels with CUDA graphs on CUDA (docs/engine.md).
    ap.add_argument("--decode-kernels", default="auto", choices=("auto", "triton", "torch"))
    ap.add_argument("--cuda-graphs", default="auto", choices=("auto", "on", "off"),
                    help="replay captured decode steps (auto: wherever the Triton kernels run on CUDA)")
    ap.add_argument("--baseline-path", action="store_true",
                    help="also measure bf16 on the gather + SDPA decode path without graphs (decode_kernels=torch)")
    args = ap.parse_args(argv)
    path = {"decode_kernels": args.decode_kernels,
            "cuda_graphs": {"auto": None, "on": True, "off": False}[args.cuda_graphs]}
    dev = args.device
    report: dict[str, Any] = {"arch": args.arch, "device": torch.cuda.get_device_name() if dev.startswith("cuda")
                              else platform.processor(), "torch": torch.__version__,
                              "input_len": args.input_len, "output_len": args.output_len, **path, "rows": []}

    def emit(row: dict[str, Any]) -> None:
        report["rows"].append(row)
        print(json.dumps(row), flush=True)
        if args.json:
            args.json.write_text(json.dumps(report, indent=1))

    def attempt(section: str, run: Any) -> None:
        """One section's failure (a kernel that does not compile for this GPU, say) is a row with its
        error, and the later sections still run: a lent GPU's minutes are too few to rerun everything."""
        try:
            run()
        except Exception as exc:  # recorded in the report, which is what this run is for
            emit({"section": section, "error": f"{type(exc).__name__}: {exc}"[:2000]})
            torch.cuda.empty_cache() if dev.startswith("cuda") else None

    if args.check_hf:
        attempt("check_hf", lambda: emit({"check": "greedy_fp32_vs_hf",
                                          **greedy_equality(args.arch, dev, args.assets, **path)}))
    bw = read_bandwidth(dev, (2 << 30) if dev.startswith("cuda") else (64 << 20))
    batches = [int(b) for b in args.batch.split(",")]
    ck = random_checkpoint(args.arch, dev, torch.bfloat16, args.assets)
    weight_bytes = sum(t.nbytes for t in ck.tensors.values())
    report |= {"read_bandwidth_gb_s": bw / 1e9, "weight_bytes": weight_bytes, "bound_tok_s": bw / weight_bytes}
    print(f"read bandwidth {bw / 1e9:.0f} GB/s; bf16 weights {weight_bytes / 1e9:.2f} GB; "
          f"batch-1 bound {bw / weight_bytes:.0f} tok/s", flush=True)
    max_len = args.input_len + args.output_len + 16

    def sealed_rows(name: str, engine_path: dict[str, Any], label: str) -> None:
        engine = make_engine(ck, DTYPES[name][0], max(batches), max_len, dev, **engine_path)
        run_sealed(engine, prompts(1, args.input_len, 0), 8)  # warm-up (Triton compiles, cuBLAS handles)
        for batch in batches if name == "bf16" else [1]:
            row = run_sealed(engine, prompts(batch, args.input_len, batch), args.output_len)
            emit({"system": label, "dtype": name, "batch": batch, **row,
                  "pct_of_bound": 100 * row["decode_tok_s"] / (bw / weight_bytes) if batch == 1 else None})
        if name == "bf16" and dev.startswith("cuda"):
            emit({"system": label, "dtype": name, "profiler": profiled_crossings(engine, prompts(1, 32, 9)[0])})
        del engine
        torch.cuda.empty_cache() if dev.startswith("cuda") else None

    for name in [] if args.only_peers else ["bf16", *[q for q in args.quant.split(",") if q]]:
        attempt(f"sealed_{name}", lambda name=name: sealed_rows(name, path, "sealed"))
    if args.baseline_path and args.decode_kernels != "torch":
        # The gather path beside the fused one, in the same run: the evidence for the default.
        attempt("sealed_gather_bf16", lambda: sealed_rows("bf16", {"decode_kernels": "torch", "cuda_graphs": False},
                                                          "sealed-gather-path"))
    compare = [c for c in args.compare.split(",") if c]
    if compare:
        hf = hf_model(ck, dev, torch.bfloat16)
        for batch in batches:
            if "hf" in compare:
                attempt(f"hf_{batch}", lambda batch=batch: emit({
                    "system": "hf", "dtype": "bf16", "batch": batch,
                    **run_hf(hf, prompts(batch, args.input_len, batch), args.output_len, static=False)}))
        if "hf-compile" in compare:
            # transformers' own compiled decode: with a static cache, generate() compiles the forward
            # (its CompileConfig, "reduce-overhead": CUDA graphs). Wrapping forward in torch.compile by
            # hand, as its older docs showed, fails under transformers 5 (the cache's in-place
            # position counter is overwritten between graph replays; H200 run, 2026-12-04).
            for batch in (int(b) for b in args.compile_batches.split(",")):
                attempt(f"hf_compile_{batch}", lambda batch=batch: emit({
                    "system": "hf-compile", "dtype": "bf16", "batch": batch,
                    **run_hf(hf, prompts(batch, args.input_len, batch), args.output_len, static=True)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
