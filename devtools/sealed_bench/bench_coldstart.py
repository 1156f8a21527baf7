"""`sealed bench coldstart`: a worker's start, phase by phase, cold and from standby (issue #49).

One host, simulated TEE, the demo model (SmolLM2-135M-Instruct, fp32 package) unless --model names another:
the stack (`api.stack.launch`: key broker, gateway, one worker) starts cold, and its worker's phases are
read from its status (boot, attest, release, decrypt, load; enclave_worker/cold_start.py). Then the
stack's worker is stopped and a standby worker (`--standby`, the same measured configuration) boots and
attests without a key; the run assigns it (`POST /internal/assign`) and sends one chat request through
the gateway as soon as the gateway routes to it. Reported (JSON): both workers' phases, and the standby
worker's first token after assignment (assignment -> ready, polled every 20 ms, plus the request's time
to first token) against its decrypt and load alone (the issue's target: <= 1.2x). The standby worker's
phases from its assignment on (assign, broker, attest, release, decrypt, load, announce, first_request,
first_token) follow one another: ``standby_unaccounted_s`` is what of the first token after assignment
they do not cover (the assignment's HTTP call, the first chunk's way back to this client). No assertion:
the figures are reported with the machine and its load average.

`--compare-vllm` runs instead `--pairs` alternating cold starts of `sealed up` and of `vllm serve` on the
same HF directory (`--model`), each to its first token, with peak RSS (coldstart_vllm.py).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from api.home import Home
from api.stack import DEMO_MODEL, free_port, launch, prepare_demo, worker_args
from enclave_worker.vllm_cpu_binding import allowed_cpus
from sealed_bench.coldstart_vllm import DTYPE, compare, has_content_chunk
from sealed_bench.peers import add_peer_options, vllm_binding, vllm_peer
from sealed_bench.processes import source_pythonpath
from sealed_bench.vllm_side import machine, vllm_interpreter

PREFIX = "sealed:cold_start_"


def phases(status: dict[str, Any]) -> dict[str, float]:
    return {k.removeprefix(PREFIX).removesuffix("_seconds"): float(v) for k, v in status.get("stats", {}).items()
            if k.startswith(PREFIX)}


def _status(url: str, timeout: float = 2.0) -> dict[str, Any]:
    try:
        return dict(httpx.get(f"{url}/internal/status", timeout=timeout).json())
    except (httpx.HTTPError, ValueError):
        return {}


def _until(url: str, wanted: str, proc: subprocess.Popen[bytes], timeout: float, poll: float = 0.02) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the standby worker exited with {proc.returncode}")
        status = _status(url)
        if status.get("status") in (wanted, "failed"):
            if status["status"] != wanted:
                raise RuntimeError(f"the standby worker failed: {status.get('reason')}")
            return status
        time.sleep(poll)
    raise TimeoutError(f"no {wanted} within {timeout:.0f} s")


def _first_token(gateway: str, api_key: str, timeout: float) -> float:
    """Seconds from sending one streamed chat request (retried while no worker is routable) to its first
    content chunk."""
    body = {"model": DEMO_MODEL, "max_tokens": 4, "temperature": 0, "stream": True,
            "messages": [{"role": "user", "content": "Hello"}]}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        sent = time.monotonic()
        with httpx.stream("POST", f"{gateway}/v1/chat/completions", json=body, timeout=120,
                          headers={"Authorization": f"Bearer {api_key}"}) as reply:
            if reply.status_code >= 500:  # not routable yet (attestation checked), or the stopped worker's last
                time.sleep(0.02)
                continue
            if has_content_chunk(reply):
                return time.monotonic() - sent
        raise RuntimeError("the answer had no content")
    raise TimeoutError("no worker answered")


def run(root: Path, model: Path | None, timeout: float) -> dict[str, Any]:
    home = Home(root / "home")
    demo = prepare_demo(home, model_path=model, log=lambda *_: None)
    stack = launch(home, port=free_port())
    proc: subprocess.Popen[bytes] | None = None
    try:
        if stack.wait_ready(timeout=timeout) != "ready":
            raise RuntimeError((home.logs / "worker.log").read_text()[-2000:])
        cold = phases(_status(stack.worker_url, timeout=60.0))
        stack.supervisor.remove("worker", timeout=25.0)  # from here on, only the standby worker serves
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        args = [*worker_args(home, stack.broker_url, port, free_port(), [stack.gateway_url]), "--standby"]
        env = {**os.environ, "PYTHONPATH": source_pythonpath()}
        proc = subprocess.Popen([sys.executable, "-m", *args], env=env, stdout=open(root / "standby.log", "wb"),  # noqa: SIM115
                                stderr=subprocess.STDOUT)
        _until(url, "standby", proc, timeout, poll=0.2)
        assigned = time.monotonic()
        if httpx.post(f"{url}/internal/assign", timeout=5.0).status_code != 202:
            raise RuntimeError("the standby worker refused its assignment")
        _until(url, "ready", proc, timeout)
        to_ready = time.monotonic() - assigned
        ttft = _first_token(stack.gateway_url, demo.api_key, timeout)
        warm = phases(_status(url, timeout=60.0))  # once: a loaded machine may answer slowly
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(30)
        stack.stop()
    decrypt_and_load = warm["decrypt"] + warm["load"]
    first_after_assignment = to_ready + ttft
    accounted = sum(seconds for phase, seconds in warm.items() if phase != "boot")
    return {"machine": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
            "load_average": [round(x, 2) for x in os.getloadavg()],
            "model": str(model) if model else DEMO_MODEL, "cold_phases_s": cold, "standby_phases_s": warm,
            "standby_unaccounted_s": round(first_after_assignment - accounted, 3),
            "standby_assignment_to_ready_s": round(to_ready, 3), "standby_first_request_ttft_s": round(ttft, 3),
            "standby_first_token_after_assignment_s": round(first_after_assignment, 3),
            "standby_decrypt_and_load_s": round(decrypt_and_load, 3),
            "ratio_first_token_to_decrypt_and_load": round(first_after_assignment / decrypt_and_load, 3),
            "target_ratio": 1.2}


def compare_vllm(args: argparse.Namespace, parser: argparse.ArgumentParser, root: Path) -> dict[str, Any]:
    peer = vllm_peer(vllm_binding(args, parser), allowed_cpus(), DTYPE, peer="vllm serve")
    report = compare(args.model.resolve(), vllm_interpreter(args), peer, args.pairs, root, args.timeout)
    return {"benchmark": "coldstart-vs-vllm", "model": str(args.model), "dtype": DTYPE, "pairs": args.pairs,
            "page_cache": "warm: each side's input files read once, untimed, just before its run",
            "vllm_config": peer.record(), "machine": machine(), **report}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="sealed bench coldstart", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, default=None, help="GGUF file or HF dir (default: the demo model)")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds for each start")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--compare-vllm", action="store_true",
                    help="cold start to the first token against `vllm serve` on --model (an HF directory)")
    ap.add_argument("--pairs", type=int, default=2, help="--compare-vllm: alternating runs per side")
    ap.add_argument("--vllm-python", default=None, help="vLLM's interpreter (default: api/vllm_python.py)")
    add_peer_options(ap)
    args = ap.parse_args(argv)
    if args.compare_vllm and (args.model is None or not args.model.is_dir()):
        ap.error("--compare-vllm needs --model, a directory of safetensors (vLLM serves the same files)")
    with tempfile.TemporaryDirectory(prefix="sealed-coldstart-") as tmp:
        report = compare_vllm(args, ap, Path(tmp)) if args.compare_vllm else run(Path(tmp), args.model, args.timeout)
    text = json.dumps(report, indent=1)
    print(text)
    if args.json:
        args.json.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
