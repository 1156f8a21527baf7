"""`sealed bench vllmserve`: serving through the whole attested stack vs plain `vllm serve`.

Side by side in one run, both under `vllm bench serve` (vLLM's own load generator, same random
dataset and seed): `sealed up --engine vllm|sealed` (gateway, key broker, attested worker decrypting
the encrypted default model into vLLM, or into our engine) and `vllm serve` on the same weights in
plaintext (float32, eager, max_model_len, max_num_seqs, KV cache bytes, prefix caching).
Runs alternate between the two; the figures are min and median output-token throughput, TTFT p50
and goodput at the --goodput SLOs, and the ratio of medians: with `--engine vllm` the stack's cost
(issue #15: <= 5%), with `--engine sealed` our engine against vLLM's (issue 38: output throughput >= 1.3x, TTFT p50
and TPOT p50 no higher, goodput no lower; medians over the pairs, each pair on fresh prompts).
`vllm serve` computes on every CPU this process may use, none reserved (peers.py; `--vllm-cpu-bind`
for another binding), as the worker's vLLM does by default; every run row records both sides'
configuration.
The plaintext directory is the reference server's input only: a temporary directory, deleted at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from enclave_worker.vllm_cpu_binding import VllmCpuBinding, allowed_cpus
from sealed_bench.peers import PeerConfig, peer_env, vllm_binding, vllm_peer
from sealed_bench.processes import REPO, source_pythonpath
from sealed_bench.serve_load import FreshPrompts
from sealed_bench.vllm_side import add_vllm_options, machine, vllm_interpreter

SERVED = "smollm2-135m-instruct"


def _plain_dir(root: Path) -> Path:
    from safetensors.torch import save_file

    from api.tenant_tools import default_model_path, load_source
    from enclave_worker.vllm_engine.runtime import architecture_config

    checkpoint = load_source(default_model_path())
    out = root / "plain"
    out.mkdir()
    save_file({k: v.contiguous() for k, v in checkpoint.tensors.items()}, str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps(architecture_config(checkpoint.config)))
    (out / "tokenizer.json").write_text(checkpoint.tokenizer_json)
    cfg = checkpoint.config
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "chat_template": checkpoint.chat_template,
        "bos_token": cfg.get("_bos_token"), "eos_token": cfg.get("_eos_token"), "pad_token": cfg.get("_eos_token"),
        "model_max_length": cfg.get("max_position_embeddings", 8192)}))
    return out


def _wait(url: str, proc: subprocess.Popen, timeout: float, headers: dict[str, str] | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            if httpx.get(url, timeout=2, headers=headers).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise TimeoutError(url)


def pair_seeds(pairs: int) -> list[int]:
    """One dataset seed per pair (FreshPrompts' draw, as `sealed bench serve` uses): both servers of
    a pair get the same prompts, and no pair repeats an earlier one's. With one seed for every run,
    each server met its own earlier prompts again from the second pair on, which its prefix cache
    may answer: a later pair then measured a warmer server than the first."""
    draw = FreshPrompts(0, 0, 0, None)
    return [draw.next_seed() for _ in range(pairs)]


def bench_command(python: str, url: str, tokenizer: Path, out: Path, args: argparse.Namespace,
                  seed: int) -> list[str]:
    """`vllm bench serve` against `url` with this run's dataset seed."""
    return [python, "-m", "sealed_bench.vllm_cli", "bench", "serve", "--backend", "openai-chat",
           "--base-url", url, "--endpoint", "/v1/chat/completions", "--model", SERVED, "--tokenizer", str(tokenizer),
           "--dataset-name", "random", "--random-input-len", str(args.input_len),
           "--random-output-len", str(args.output_len), "--num-prompts", str(args.num_prompts),
           "--max-concurrency", str(args.concurrency), "--ignore-eos", "--seed", str(seed),
           *(["--goodput", *args.goodput] if args.goodput else []),
           "--save-result", "--result-dir", str(out.parent), "--result-filename", out.name]


def _bench(python: str, url: str, tokenizer: Path, out: Path, args: argparse.Namespace, api_key: str,
           seed: int) -> dict:
    cmd = bench_command(python, url, tokenizer, out, args, seed)
    env = {**os.environ, "OPENAI_API_KEY": api_key, "PYTHONPATH": source_pythonpath()}
    proc = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=3600)
    if proc.returncode != 0:
        raise RuntimeError(proc.stdout[-2000:] + proc.stderr[-2000:])
    doc = json.loads(out.read_text())
    return {k: doc.get(k) for k in ("completed", "request_throughput", "output_throughput", "median_ttft_ms",
                                    "median_tpot_ms", "median_itl_ms", "request_goodput", "duration")}


def sealed_side(engine: str) -> dict:
    """The attested stack's engine configuration, recorded beside the peer's: the worker (a child of
    this process, with its CPUs) binds its vLLM to every CPU by default (WorkerSettings.vllm_cpu_bind);
    our engine's thread team takes every CPU too."""
    if engine == "vllm":
        return {"engine": "vllm", "vllm_cpu_bind": "all",
                **vllm_peer(VllmCpuBinding(), allowed_cpus(), "float32", peer="sealed up --engine vllm").record()}
    return {"engine": "sealed", "threads": len(allowed_cpus()), "dtype": "float32"}


def _summary(runs: list[dict]) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for key in ("output_throughput", "median_ttft_ms", "median_tpot_ms", "request_goodput"):
        values = [r[key] for r in runs if r.get(key) is not None]
        out[f"min_{key}"] = min(values) if values else None
        out[f"median_{key}"] = statistics.median(values) if values else None
    return out


def engine_targets(summary: dict[str, dict[str, float | None]]) -> dict[str, bool]:
    """Issue 38's targets for `--engine sealed`, each from the medians over the pairs."""
    ours, peer = summary["sealed"], summary["plain"]

    def med(side: dict[str, float | None], key: str) -> float:
        value = side[f"median_{key}"]
        return float("nan") if value is None else value

    return {"throughput_1_3x": med(ours, "output_throughput") >= 1.3 * med(peer, "output_throughput"),
            "ttft_p50_no_higher": med(ours, "median_ttft_ms") <= med(peer, "median_ttft_ms"),
            "tpot_p50_no_higher": med(ours, "median_tpot_ms") <= med(peer, "median_tpot_ms"),
            "goodput_no_lower": med(ours, "request_goodput") >= med(peer, "request_goodput")}


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sealed bench vllmserve", description=__doc__.splitlines()[0])
    parser.add_argument("--num-prompts", type=int, default=32)
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--pairs", type=int, default=2, help="alternating runs per server")
    parser.add_argument("--engine", choices=("vllm", "sealed"), default="vllm",
                        help="the engine in the attested stack's worker")
    parser.add_argument("--goodput", nargs="*", default=[], metavar="KEY:MS",
                        help="SLOs for vLLM's goodput, e.g. ttft:2000 tpot:200")
    add_vllm_options(parser)
    args = parser.parse_args(argv)
    binding = vllm_binding(args, parser)
    from api.stack import free_port

    python = vllm_interpreter(args)
    peer: PeerConfig = vllm_peer(binding, allowed_cpus(), "float32", peer="vllm serve")
    configs = {"sealed": sealed_side(args.engine), "plain": peer.record()}
    root = Path(tempfile.mkdtemp(prefix="sealed-bench-vllmserve-"))
    procs: list[subprocess.Popen] = []
    try:
        plain = _plain_dir(root)
        sealed_port, plain_port = free_port(), free_port()
        env = {**os.environ, "SEALED_HOME": str(root / "home"), "SEALED_VLLM_PYTHON": python,
               "PYTHONPATH": source_pythonpath()}
        procs.append(subprocess.Popen([sys.executable, "-m", "api.cli.main", "up", "--engine", args.engine,
                                       "--port", str(sealed_port)], env=env, cwd=REPO, start_new_session=True,
                                      stdout=open(root / "up.log", "wb"), stderr=subprocess.STDOUT))  # noqa: SIM115
        _wait(f"http://127.0.0.1:{sealed_port}/readyz", procs[-1], 1200)
        api_key = (root / "home" / "demo" / "api-key").read_text().strip()
        procs.append(subprocess.Popen([python, "-m", "sealed_bench.vllm_cli", "serve", str(plain),
                                       "--served-model-name", SERVED, "--port", str(plain_port), "--dtype", "float32",
                                       "--enforce-eager", "--max-model-len", "2048", "--max-num-seqs", "16",
                                       "--kv-cache-memory-bytes", str(256 << 20), "--seed", "0"],
                                      env=peer_env({**os.environ, "PYTHONPATH": source_pythonpath()}, peer), cwd=REPO,
                                      start_new_session=True,
                                      stdout=open(root / "vllm-serve.log", "wb"), stderr=subprocess.STDOUT))  # noqa: SIM115
        _wait(f"http://127.0.0.1:{plain_port}/v1/models", procs[-1], 1200)
        runs: dict[str, list[dict]] = {"sealed": [], "plain": []}
        for i, seed in enumerate(pair_seeds(args.pairs)):
            for name in (("sealed", "plain") if i % 2 == 0 else ("plain", "sealed")):
                port = sealed_port if name == "sealed" else plain_port
                runs[name].append(_bench(python, f"http://127.0.0.1:{port}", plain, root / f"{name}-{i}.json", args,
                                         api_key if name == "sealed" else "none", seed)
                                  | {"config": configs[name], "seed": seed})
                print(name, json.dumps(runs[name][-1]), flush=True)
    finally:
        for proc in reversed(procs):
            _stop(proc)
        shutil.rmtree(root, ignore_errors=True)
    med = {name: statistics.median(r["output_throughput"] for r in rs) for name, rs in runs.items()}
    summary = {name: _summary(rs) for name, rs in runs.items()}
    ratio = med["sealed"] / med["plain"]
    cost = 1 - ratio
    checks = {"cost_at_most_5pct": cost <= 0.05} if args.engine == "vllm" else engine_targets(summary)
    met = all(checks.values())
    result = {"benchmark": "vllmserve", "engine": args.engine, "runs": runs, "summary": summary,
              "median_output_tok_per_s": med, "ratio": round(ratio, 4), "cost": round(cost, 4),
              "target": ("cost <= 5%" if args.engine == "vllm"
                         else "ratio >= 1.3x; TTFT p50, TPOT p50 <= vLLM's; goodput >= vLLM's"),
              "checks": checks, "met": met,
              "workload": vars(args) | {"json": str(args.json)}, "configs": configs,
              "machine": machine()}
    for name, row in summary.items():
        print(name, json.dumps(row))
    print(f"vllm serve: {peer.label} ({peer.binding})")
    if args.engine == "vllm":
        print(f"attested stack {med['sealed']:.1f} tok/s vs vllm serve {med['plain']:.1f} tok/s: cost {cost:.1%} "
              "(target <= 5%)")
    else:
        print(f"attested stack (our engine) {med['sealed']:.1f} tok/s vs vllm serve {med['plain']:.1f} tok/s: "
              f"{ratio:.2f}x (target >= 1.3x)")
        print("targets (medians): " + ", ".join(f"{k} {'met' if v else 'NOT met'}" for k, v in checks.items()))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2, default=str))
    return 0
