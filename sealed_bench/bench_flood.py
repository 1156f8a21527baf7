"""Flood benchmark: a quiet tenant's latency while 500 streams run and another tenant floods.

Run: ``sealed bench flood`` (from a checkout: the workers are ``tests/api/fake_worker.py``).
A real gateway process (the `python -m api.gateway` that `sealed up` runs, its fair queue,
admission and metering) in front of stand-in workers that speak the real gRPC protocol, heartbeats
and signed usage, answering one token every `--token-delay` seconds: the 2-core machines we have
cannot run 500 streams through the real engine, and what is measured here is the gateway.

Three tenants: `bulk` keeps `--streams` streams open (each `--stream-tokens` tokens, replaced as
it ends), `flood` sends maximal requests (16 prompts x n=4 = 64 choices, the per-request bound,
`--flood-max-tokens` each) from `--flood-concurrency` clients without pause, and `quiet` sends
`--quiet-requests` streamed requests, `--quiet-concurrency` at a time, once alone (the baseline)
and once under the load. Reported: the quiet tenant's successes and TTFT (p50, p99) both times and
the ratio (target: all succeed, p99 <= 2x); every tenant's completed choices against the signed
usage rows the gateway stored (target: equal; nothing lost).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

TENANTS = ("quiet", "bulk", "flood")
MODEL = "m"


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


class Counts:
    def __init__(self) -> None:
        self.choices_done: dict[str, int] = dict.fromkeys(TENANTS, 0)
        self.status: dict[str, dict[str, int]] = {t: {} for t in TENANTS}

    def saw(self, tenant: str, status: int | str) -> None:
        self.status[tenant][str(status)] = self.status[tenant].get(str(status), 0) + 1


async def stream(client: httpx.AsyncClient, key: str, tenant: str, body: dict, counts: Counts) -> float | None:
    """One streamed request; returns its TTFT (s) when it completed with [DONE], else None."""
    started, ttft, done = time.perf_counter(), None, False
    try:
        async with client.stream("POST", "/v1/completions", json={**body, "stream": True},
                                 headers={"Authorization": f"Bearer {key}"}) as r:
            if r.status_code != 200:
                await r.aread()
                counts.saw(tenant, r.status_code)
                return None
            async for line in r.aiter_lines():
                if line.startswith("data: ") and ttft is None:
                    ttft = time.perf_counter() - started
                if line == "data: [DONE]":
                    done = True
    except httpx.HTTPError as exc:
        counts.saw(tenant, type(exc).__name__)
        return None
    if not done:
        counts.saw(tenant, "incomplete")
        return None
    counts.saw(tenant, 200)
    prompts = body["prompt"] if isinstance(body["prompt"], list) else [body["prompt"]]
    counts.choices_done[tenant] += len(prompts) * body.get("n", 1)
    return ttft


async def quiet_run(client: httpx.AsyncClient, key: str, args: argparse.Namespace, counts: Counts
                    ) -> list[float | None]:
    body = {"model": MODEL, "prompt": "hello", "max_tokens": args.quiet_tokens}
    sem, out = asyncio.Semaphore(args.quiet_concurrency), []

    async def one() -> None:
        async with sem:
            out.append(await stream(client, key, "quiet", body, counts))

    await asyncio.gather(*(one() for _ in range(args.quiet_requests)))
    return out


async def load(args: argparse.Namespace, url: str, keys: dict[str, str]) -> dict[str, Any]:
    counts = Counts()
    limits = httpx.Limits(max_connections=args.streams + args.flood_concurrency + 64, max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client:
        baseline = await quiet_run(client, keys["quiet"], args, counts)
        stop = asyncio.Event()
        bulk_body = {"model": MODEL, "prompt": "bulk", "max_tokens": args.stream_tokens}
        flood_body = {"model": MODEL, "prompt": ["flood"] * 16, "n": 4, "max_tokens": args.flood_max_tokens}

        async def keep(tenant: str, body: dict) -> None:
            while not stop.is_set():
                if await stream(client, keys[tenant], tenant, body, counts) is None:
                    await asyncio.sleep(0.05)  # refused (429): the flooder retries at once, nearly

        workers = [asyncio.create_task(keep("bulk", bulk_body)) for _ in range(args.streams)]
        workers += [asyncio.create_task(keep("flood", flood_body)) for _ in range(args.flood_concurrency)]
        await asyncio.sleep(args.warmup_s)
        loaded_started = time.perf_counter()
        loaded = await quiet_run(client, keys["quiet"], args, counts)
        loaded_s = time.perf_counter() - loaded_started
        stop.set()
        await asyncio.gather(*workers)  # every open stream ends normally: usage can be compared exactly
    ok_base = [t for t in baseline if t is not None]
    ok_loaded = [t for t in loaded if t is not None]
    p99_base, p99_loaded = _pct(ok_base, 99), _pct(ok_loaded, 99)
    return {
        "quiet": {"requests": args.quiet_requests, "succeeded_alone": len(ok_base), "succeeded_loaded": len(ok_loaded),
                  "ttft_alone_ms": {"p50": 1000 * (statistics.median(ok_base) if ok_base else 0),
                                    "p99": 1000 * (p99_base or 0)},
                  "ttft_loaded_ms": {"p50": 1000 * (statistics.median(ok_loaded) if ok_loaded else 0),
                                     "p99": 1000 * (p99_loaded or 0)},
                  "p99_ratio": (p99_loaded / p99_base) if p99_base and p99_loaded else None,
                  "loaded_phase_s": loaded_s},
        "statuses": counts.status, "choices_completed": counts.choices_done,
    }


def _spawn(args: list[str], log: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", *args], stdout=open(log, "ab"),
                            stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})


def run(args: argparse.Namespace) -> dict[str, Any]:
    from api.stack import free_port
    from api.store.db import make_engine, session_factory, upgrade
    from api.store.repo import Store

    root = Path(tempfile.mkdtemp(prefix="sealed-bench-flood-"))
    data = root / "gateway"
    data.mkdir()
    engine = make_engine(f"sqlite:///{data / 'control-plane.db'}")
    upgrade(engine)
    store = Store(session_factory(engine))
    keys = {t: store.create_key(t, "bench")[0] for t in TENANTS}
    (root / "routes.json").write_text(json.dumps([{"tenant": t, "model": MODEL, "version": "v1"} for t in TENANTS]))
    token = root / "register-token"
    token.write_text("bench-register-token-" + "x" * 32)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    procs = [_spawn(["api.gateway", "--data-dir", str(data), "--routes", str(root / "routes.json"), "--port",
                     str(port), "--dev", "--register-token-file", str(token), "--max-inflight",
                     str(args.max_inflight)], root / "gateway.log")]
    try:
        for t in TENANTS:
            procs.append(_spawn(["tests.api.fake_worker", "--gateway", url, "--token-file", str(token), "--tenant", t,
                                 "--model", MODEL, "--grpc-port", str(free_port()), "--http-port", str(free_port()),
                                 "--delay", str(args.token_delay)], root / f"worker-{t}.log"))
        deadline = time.monotonic() + 120
        while True:  # every tenant's model listed: a worker can answer (#14)
            try:
                if all(httpx.get(f"{url}/v1/models", headers={"Authorization": f"Bearer {keys[t]}"}, timeout=5
                                 ).json()["data"] for t in TENANTS):
                    break
            except (httpx.HTTPError, ValueError, KeyError):
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"stack did not come up; see {root}")
            time.sleep(0.3)
        result = asyncio.run(load(args, url, keys))
        time.sleep(2.0)  # the last usage records are stored off the event loop
        rows = {t: sum(r["requests"] for r in store.usage_summary(t)) for t in TENANTS}
        result["usage_rows"] = rows
        result["usage_exact"] = rows == result["choices_completed"]
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sealed bench flood", description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=500, help="concurrent streams of the bulk tenant")
    parser.add_argument("--stream-tokens", type=int, default=16)
    parser.add_argument("--flood-concurrency", type=int, default=16, help="clients sending maximal requests")
    parser.add_argument("--flood-max-tokens", type=int, default=64)
    parser.add_argument("--quiet-requests", type=int, default=40)
    parser.add_argument("--quiet-concurrency", type=int, default=2)
    parser.add_argument("--quiet-tokens", type=int, default=8)
    parser.add_argument("--token-delay", type=float, default=0.02, help="the stand-in worker's seconds per token")
    parser.add_argument("--max-inflight", type=int, default=256, help="the gateway's dispatch slots")
    parser.add_argument("--warmup-s", type=float, default=5.0, help="load before the quiet tenant starts")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    result = run(args)
    quiet = result["quiet"]
    result["targets"] = {"quiet_all_succeeded": quiet["succeeded_loaded"] == quiet["requests"],
                         "quiet_p99_within_2x": quiet["p99_ratio"] is not None and quiet["p99_ratio"] <= 2.0,
                         "usage_exact": result["usage_exact"]}
    result["parameters"] = vars(args) | {"json": str(args.json) if args.json else None}
    result["machine"] = {"cores": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
                         "cpu": next((line.split(":", 1)[1].strip() for line in
                                      Path("/proc/cpuinfo").read_text().splitlines()
                                      if line.startswith("model name")), platform.processor())}
    text = json.dumps(result, indent=2, sort_keys=True)
    print(text)
    if args.json:
        args.json.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
