"""`sealed bench coldstart --compare-vllm`: cold start to the first token, `sealed up` against `vllm serve`
on the same plaintext safetensors (issue 49: ours <= 1.15x vLLM's; peak RSS <= 1.15x the weights as held
plus the KV pool).

One invocation runs `--pairs` pairs, alternating which side goes first; every run starts fresh
processes and stops them before the next. Each side is timed from its process's start to the first
content chunk of one streamed chat request (greedy, 4 tokens), retried every 50 ms until the server
routes it:
- ours: `sealed up` (a child process, on a home prepared once: the HF directory encrypted into the
  demo package; key broker, gateway and worker start, the worker attests, is released its key,
  decrypts, loads and registers), the request through the gateway;
- vLLM: `vllm serve DIR` in vLLM's virtualenv at the configuration the other vLLM benchmarks use
  (peers.py: every CPU bound, none reserved; eager; the worker's max_model_len, max_num_seqs and KV
  pool), the request straight to it.
Both serve the engine's default CPU dtype (float32; the worker's dtype is measured, so `sealed up`
cannot serve another): vLLM gets the same `--dtype`.

Page cache: drop_caches would disturb everything else on the machine, so the cache is warm instead:
each side's input files (our package; vLLM's safetensors directory) are read once, untimed, just
before its run. Peak RSS (tree_rss.py): our worker process; vLLM's processes summed (the API server
and the engine core it forks, and any other child), against the weights as held plus the KV pool
that the worker's status reports.
"""

from __future__ import annotations

import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from api.home import Home
from api.stack import DEMO_MODEL, DEMO_TENANT, DEMO_VERSION, free_port, prepare_demo
from sealed_bench.peers import PeerConfig, peer_env
from sealed_bench.processes import REPO, source_pythonpath
from sealed_bench.tree_rss import TreeRssSampler

DTYPE = "float32"  # the worker's default on a CPU (WorkerSettings.dtype); measured, so `sealed up` serves it
MAX_MODEL_LEN, MAX_NUM_SEQS, KV_BYTES = 2048, 16, 256 << 20  # the worker's defaults (enclave_worker/settings.py)
MAX_TOKENS = 4
GIB = 2**30
# vLLM's own start-up lines (its log): each one's time after the process started (its log's clock,
# whole seconds), and the durations some of them state.
_VLLM_MILESTONES = {
    "api_server_logs": r"\(APIServer pid=\d+\) INFO",
    "engine_core_logs": r"\(EngineCore pid=\d+\) INFO",
    "worker_logs": r"\(Worker pid=\d+\) INFO",
    "weights_loaded": r"Loading weights took",
    "engine_ready": r"init engine \(profile, create kv cache, warmup model\) took",
    "server_listening": r"Starting vLLM server on",
}
_VLLM_TOOK = {
    "initialize_model": r"Initializing model took ([\d.]+) s",
    "load_weights": r"Loading weights took ([\d.]+) s",
    "init_engine": r"init engine \(profile, create kv cache, warmup model\) took ([\d.]+) s",
}
_VLLM_CLOCK = re.compile(r"INFO (\d\d-\d\d \d\d:\d\d:\d\d)")


def read_once(path: Path) -> int:
    """Read every file under `path` (the page cache warm before a run); returns the bytes read."""
    total = 0
    for file in sorted(p for p in ([path] if path.is_file() else path.rglob("*")) if p.is_file()):
        with open(file, "rb") as fh:
            while chunk := fh.read(16 << 20):
                total += len(chunk)
    return total



def has_content_chunk(reply: httpx.Response) -> bool:
    """Read a streamed chat reply (raising on an error status) until its first chunk with content:
    True when one came, False when the stream ended without any."""
    reply.raise_for_status()
    for line in reply.iter_lines():
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        choices = json.loads(line[6:]).get("choices") or [{}]
        if (choices[0].get("delta") or {}).get("content"):
            return True
    return False

def first_content(
    url: str, headers: dict[str, str], deadline: float, alive: subprocess.Popen[bytes]
) -> dict[str, float]:
    """Send one streamed greedy chat request until one is answered (connection refused, 404 or 5xx:
    not routable yet); monotonic times of the answered request's sending and of its first content chunk."""
    body = {
        "model": DEMO_MODEL,
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "stream": True,
        "messages": [{"role": "user", "content": "Hello"}],
    }
    while time.monotonic() < deadline:
        if alive.poll() is not None:
            raise RuntimeError(f"the server exited with {alive.returncode} before it answered")
        sent = time.monotonic()
        try:
            with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, headers=headers, timeout=600) as reply:
                if reply.status_code == 404 or reply.status_code >= 500:
                    time.sleep(0.05)
                    continue
                if has_content_chunk(reply):
                    return {"sent": sent, "first": time.monotonic()}
            raise RuntimeError("the answer had no content")
        except httpx.TransportError:
            time.sleep(0.05)
    raise TimeoutError("no first token in time")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGINT to the process's group (`sealed up` stops its children; vLLM its engine core), then kill."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(90)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)


def _worker_status(home: Home) -> dict[str, Any]:
    url = json.loads((home.root / "run" / "pids.json").read_text())["worker_url"]
    return dict(httpx.get(f"{url}/internal/status", timeout=60).json())


def _is_worker(cmdline: bytes) -> bool:
    return b"enclave_worker" in cmdline


def ours(home: Home, api_key: str, root: Path, run: int, timeout: float) -> dict[str, Any]:
    """One cold `sealed up` to its first token through the gateway."""
    port = free_port()
    env = {**os.environ, "SEALED_HOME": str(home.root), "PYTHONPATH": source_pythonpath()}
    start = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "api.cli.main", "up", "--port", str(port)],
        env=env,
        cwd=REPO,
        start_new_session=True,
        stdout=open(root / f"up-{run}.log", "wb"),  # noqa: SIM115
        stderr=subprocess.STDOUT,
    )
    worker = TreeRssSampler([proc.pid], only=_is_worker).start()
    stack = TreeRssSampler([proc.pid]).start()
    try:
        try:
            t = first_content(f"http://127.0.0.1:{port}", {"Authorization": f"Bearer {api_key}"}, start + timeout, proc)
        except (TimeoutError, RuntimeError) as exc:
            logs = [root / f"up-{run}.log", home.logs / "worker.log"]
            tails = "; ".join(f"{p.name} ends: {p.read_text(errors='replace')[-1500:]}" for p in logs if p.exists())
            raise RuntimeError(f"sealed up: {exc}; {tails}") from exc
        rss, stack_rss = worker.stop(), stack.stop()
        stats = _worker_status(home).get("stats", {})
    finally:
        worker.stop()
        stack.stop()
        _stop(proc)
    prefix = "sealed:cold_start_"
    phases = {
        k.removeprefix(prefix).removesuffix("_seconds"): round(float(v), 3)
        for k, v in stats.items()
        if k.startswith(prefix)
    }
    return {
        "first_token_s": round(t["first"] - start, 3),
        "answered_request_sent_s": round(t["sent"] - start, 3),
        "answered_request_ttft_s": round(t["first"] - t["sent"], 3),
        "worker_phases_s": phases,
        # CLI, broker and gateway started one after the other, the worker process spawned; the first
        # chunk's way back through the gateway: what the worker's own phases do not cover
        "outside_worker_phases_s": round(t["first"] - start - sum(phases.values()), 3),
        "peak_rss_worker": rss.record(),
        "peak_rss_stack": stack_rss.record(),
        "weights_held_bytes": stats.get("weights_held_bytes"),
        "kv_pool_bytes": stats.get("kv_pool_bytes"),
    }


def vllm_command(python: str, model: Path, port: int) -> list[str]:
    return [
        python,
        "-m",
        "sealed_bench.vllm_cli",
        "serve",
        str(model),
        "--served-model-name",
        DEMO_MODEL,
        "--port",
        str(port),
        "--dtype",
        DTYPE,
        "--enforce-eager",
        "--max-model-len",
        str(MAX_MODEL_LEN),
        "--max-num-seqs",
        str(MAX_NUM_SEQS),
        "--kv-cache-memory-bytes",
        str(KV_BYTES),
        "--seed",
        "0",
    ]


def vllm_phases(log: str, started: float) -> dict[str, dict[str, float]]:
    """From vLLM's log: when each milestone's first line was written, in seconds after `started` (the
    process's start, epoch seconds), and the durations its own lines state."""
    year = time.localtime(started).tm_year
    milestones: dict[str, float] = {}
    for line in log.splitlines():
        clock = _VLLM_CLOCK.search(line)
        if clock is None:
            continue
        for name, pattern in _VLLM_MILESTONES.items():
            if name not in milestones and re.search(pattern, line):
                when = time.mktime(time.strptime(f"{year}-{clock.group(1)}", "%Y-%m-%d %H:%M:%S"))
                milestones[name] = round(when - started, 1)
    took = {name: float(m.group(1)) for name, pattern in _VLLM_TOOK.items() if (m := re.search(pattern, log))}
    return {"milestones_s": milestones, "took_s": took}


def vllm(python: str, model: Path, peer: PeerConfig, root: Path, run: int, timeout: float) -> dict[str, Any]:
    """One cold `vllm serve` to its first token."""
    port = free_port()
    log = root / f"vllm-{run}.log"
    start, wall = time.monotonic(), time.time()
    proc = subprocess.Popen(
        vllm_command(python, model, port),
        cwd=REPO,
        start_new_session=True,
        env=peer_env({**os.environ, "PYTHONPATH": source_pythonpath()}, peer),
        stdout=open(log, "wb"),  # noqa: SIM115
        stderr=subprocess.STDOUT,
    )
    sampler = TreeRssSampler([proc.pid]).start()
    try:
        t = first_content(f"http://127.0.0.1:{port}", {}, start + timeout, proc)
        rss = sampler.stop()
    except (TimeoutError, RuntimeError) as exc:
        raise RuntimeError(f"vllm serve: {exc}; its log ends: {log.read_text(errors='replace')[-1500:]}") from exc
    finally:
        sampler.stop()
        _stop(proc)
    return {
        "first_token_s": round(t["first"] - start, 3),
        "answered_request_sent_s": round(t["sent"] - start, 3),
        "answered_request_ttft_s": round(t["first"] - t["sent"], 3),
        **vllm_phases(log.read_text(errors="replace"), wall),
        "peak_rss": rss.record(),
    }


def compare(model: Path, python: str, peer: PeerConfig, pairs: int, root: Path, timeout: float) -> dict[str, Any]:
    """`pairs` alternating cold starts of each side; medians and the issue's two ratios."""
    home = Home(root / "home")
    demo = prepare_demo(home, model_path=model, log=lambda *_: None)  # the tenant's encryption: not timed
    package = home.package(DEMO_TENANT, DEMO_MODEL, DEMO_VERSION)
    runs: dict[str, list[dict[str, Any]]] = {"sealed": [], "vllm": []}
    for i in range(pairs):
        for side in ("sealed", "vllm") if i % 2 == 0 else ("vllm", "sealed"):
            read_once(package if side == "sealed" else model)
            load = round(os.getloadavg()[0], 2)  # other work on the machine as this run starts
            row = (
                ours(home, demo.api_key, root, i, timeout)
                if side == "sealed"
                else vllm(python, model, peer, root, i, timeout)
            )
            runs[side].append({**row, "loadavg_1m_at_start": load})
            print(side, json.dumps(row), flush=True)
    return summarise(runs)


def summarise(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    med = {side: statistics.median(r["first_token_s"] for r in rows) for side, rows in runs.items()}
    last = runs["sealed"][-1]
    held = (last["weights_held_bytes"] or 0) + (last["kv_pool_bytes"] or 0)
    worker_peak = statistics.median(r["peak_rss_worker"]["hwm_sum_gib"] for r in runs["sealed"])
    vllm_peak = statistics.median(r["peak_rss"]["sampled_peak_gib"] for r in runs["vllm"])
    return {
        "runs": runs,
        "median_first_token_s": med,
        "ratio_first_token": round(med["sealed"] / med["vllm"], 3),
        "target_ratio": 1.15,
        "weights_held_gib": round((last["weights_held_bytes"] or 0) / GIB, 3),
        "kv_pool_gib": round((last["kv_pool_bytes"] or 0) / GIB, 3),
        "median_peak_rss_worker_gib": worker_peak,
        "median_peak_rss_vllm_sampled_gib": vllm_peak,
        "ratio_worker_rss_to_held": round(worker_peak * GIB / held, 3) if held else None,
        "target_rss_ratio": 1.15,
    }
