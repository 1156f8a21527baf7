"""`sealed bench serve --sealed`: the two clients (this package's load generator, `vllm bench serve`
through a `sealed proxy`) wired to the paired runs of serve_pairs.py, and the report."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sealed_bench.processes import wait_healthy
from sealed_bench.serve_load import FreshPrompts, load_tokenizer, print_summary, run_load, summarize
from sealed_bench.serve_pairs import CpuMeter, RunBoth, paired, paired_mixed, print_costs, stack_pids


def _machine() -> dict[str, Any]:
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": model, "cpus": os.cpu_count(), "python": platform.python_version(), "system": platform.platform()}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _vllm_args(args: argparse.Namespace, tokenizer_dir: Path) -> list[str]:
    out = ["--backend", "openai", "--endpoint", "/v1/completions", "--model", args.model,
           "--tokenizer", str(tokenizer_dir), "--dataset-name", "random",
           "--random-input-len", str(args.random_input_len), "--random-output-len", str(args.random_output_len),
           "--num-prompts", str(args.num_prompts), "--request-rate", str(args.request_rate),
           "--seed", str(args.seed), "--disable-tqdm", "--percentile-metrics", "ttft,tpot,itl,e2el",
           "--metric-percentiles", "50,99"]
    if args.max_concurrency:
        out += ["--max-concurrency", str(args.max_concurrency)]
    if args.ignore_eos:
        out.append("--ignore-eos")
    return out


Runner = tuple[Callable[[str, Callable[[], None]], dict], Callable[[], None]]


def _other(label: str) -> str:
    return "sealed" if label == "plaintext" else "plaintext"


def _half(args: argparse.Namespace) -> int:
    concurrency: int = args.max_concurrency or args.num_prompts
    return max(concurrency // 2, 1)


def _builtin(args: argparse.Namespace, pids: dict[str, list[int]]) -> Runner:
    fresh = FreshPrompts(args.num_prompts, args.random_input_len, args.seed, load_tokenizer(args.tokenizer_gguf))
    pids["client"] = [os.getpid()]

    def run(label: str, mark: Callable[[], None]) -> dict[str, Any]:
        results, duration = asyncio.run(run_load(
            args.url, args.model, args.api_key, fresh.next(), args.random_output_len, args.request_rate,
            args.max_concurrency, args.seed, args.ignore_eos, args.policy if label == "sealed" else None,
            args.unsafe_allow_simulated, on_start=mark))
        return summarize(results, duration, {}) | {"client": "sealed bench serve"}

    return run, lambda: None


def _builtin_mixed(args: argparse.Namespace, pids: dict[str, list[int]]) -> RunBoth:
    """Both modes at once, half the concurrency each; each run of each mode gets prompts of its own
    (the same lengths; a prompt served before would hit the prefix cache)."""
    fresh = FreshPrompts(args.num_prompts, args.random_input_len, args.seed, load_tokenizer(args.tokenizer_gguf))
    pids["client"] = [os.getpid()]

    def run_both(first: str, mark: Callable[[], None]) -> dict[str, dict]:
        marked: list[bool] = []
        sets = [fresh.next(), fresh.next()]

        def mark_once() -> None:
            if not marked:
                marked.append(True)
                mark()

        async def go() -> dict[str, dict]:
            gate = asyncio.Barrier(2)

            async def mode(label: str, prompts: list[str]) -> tuple[str, dict]:
                results, duration = await run_load(
                    args.url, args.model, args.api_key, prompts, args.random_output_len, args.request_rate,
                    _half(args), args.seed, args.ignore_eos, args.policy if label == "sealed" else None,
                    args.unsafe_allow_simulated, on_start=mark_once, gate=gate)
                return label, summarize(results, duration, {}) | {"client": "sealed bench serve"}

            pairs = await asyncio.gather(mode(first, sets[0]), mode(_other(first), sets[1]))
            return dict(pairs)

        return asyncio.run(go())

    return run_both


def _vllm(args: argparse.Namespace, pids: dict[str, list[int]], scratch: Path) -> Runner:
    from sealed_bench.vllm_client import VllmBench, write_hf_tokenizer

    tokenizer_dir = write_hf_tokenizer(args.tokenizer_gguf, scratch / "tokenizer")
    port = _free_port()
    command = [sys.executable, "-m", "api.cli.main", "proxy", "--upstream", f"{args.url.rstrip('/')}/v1",
               "--policy", str(args.policy), "--port", str(port)]
    if args.unsafe_allow_simulated:
        command.append("--unsafe-allow-simulated")
    proxy = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    proxy_url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(proxy, proxy_url, timeout_s=180)
        _warm_proxy(proxy_url, args)  # the proxy verifies the deployment once, before any run
        bench = VllmBench(args.vllm_python, _vllm_args(args, tokenizer_dir), args.api_key)
    except BaseException:
        proxy.kill()
        raise
    # The proxy's CPU, not vLLM's: each vLLM run also loads its tokenizer and builds its dataset.
    pids["proxy"] = [proxy.pid]

    seeds = FreshPrompts(0, 0, args.seed, None)  # vLLM makes the prompts: a new seed for every run

    def run(label: str, mark: Callable[[], None]) -> dict[str, Any]:
        mark()  # vLLM's own warm-up (one test prompt) is inside its run
        return bench.run(args.url if label == "plaintext" else proxy_url, label, ("--seed", str(seeds.next_seed())))

    runner: Callable[[str, Callable[[], None]], dict[str, Any]] = run

    if args.mixed:  # a second driver: the two modes' loads run at the same time, half the concurrency each
        second = VllmBench(args.vllm_python, _vllm_args(args, tokenizer_dir), args.api_key)
        drivers = {"plaintext": bench, "sealed": second}
        urls = {"plaintext": args.url, "sealed": proxy_url}

        def run_both(first: str, mark: Callable[[], None]) -> dict[str, dict]:
            from concurrent.futures import ThreadPoolExecutor

            mark()
            half = ("--max-concurrency", str(_half(args)))
            with ThreadPoolExecutor(2) as pool:
                futures = {label: pool.submit(drivers[label].run, urls[label], label,
                                              (*half, "--seed", str(seeds.next_seed())))
                           for label in (first, _other(first))}
                return {label: f.result() for label, f in futures.items()}

        runner = run_both

    def close() -> None:
        bench.close()
        if args.mixed:
            second.close()
        proxy.terminate()
        proxy.wait(timeout=30)

    return runner, close


def _warm_proxy(proxy_url: str, args: argparse.Namespace) -> None:
    import httpx

    r = httpx.post(f"{proxy_url}/v1/completions", headers={"Authorization": f"Bearer {args.api_key}"}, timeout=600,
                   json={"model": args.model, "prompt": "warm up", "max_tokens": 2})
    if r.status_code != 200:
        raise RuntimeError(f"the sealed proxy answered {r.status_code}: {r.text[:300]}")


def run_sealed(args: argparse.Namespace) -> int:
    pids = stack_pids(args.home)
    with tempfile.TemporaryDirectory() as scratch:
        if args.client == "vllm":
            run, close = _vllm(args, pids, Path(scratch))
        elif args.mixed:
            run, close = _builtin_mixed(args, pids), lambda: None
        else:
            run, close = _builtin(args, pids)
        try:
            runner = paired_mixed if args.mixed else paired
            report = runner(run, args.pairs, CpuMeter(pids), print_summary)
        finally:
            close()
    print_costs(report)
    conditions = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()
                  if "api_key" not in k and k != "json"}
    report = {"conditions": conditions, "machine": _machine(), **report}
    if args.json:
        args.json.write_text(json.dumps(report, indent=1, default=str))
    return 0 if all(r["failed"] == 0 for r in report["runs"]) else 1
