"""Flood benchmark: a quiet tenant's latency while 500 streams run and another tenant floods.

Run: ``sealed bench flood`` (from a checkout: the workers are ``tests/api/fake_worker.py``).
A real gateway process (the `python -m api.gateway` that `sealed up` runs, its fair queue,
admission, audit and metering) in front of stand-in workers that speak the real gRPC protocol,
heartbeats and signed usage, answering one token every `--token-delay` seconds: the 2-core machines
we have cannot run 500 streams through the real engine, and what is measured here is the gateway.

Tenants: `bulk` keeps `--streams` streams open (each `--stream-tokens` tokens, replaced as it ends);
`flood` sends maximal requests (16 prompts x n=4 = 64 choices, the per-request bound,
`--flood-max-tokens` each) from `--flood-concurrency` clients without pause, under its own limits
(`--flood-rpm`, `--flood-max-queued`: it is answered 429 by them); `quiet` sends `--quiet-requests`
streamed requests, `--quiet-concurrency` at a time, once alone (the baseline) and once under the
load; and a client with unknown keys sends `--unauthorized` requests (401s). The load runs in this
process on a cheap raw-HTTP client (`rawload.py`); the quiet tenant is measured with httpx in a
process of its own, so its numbers are not the load generator's own event-loop lag.

Reported: the quiet tenant's successes and TTFT (p50, p99) both times and the ratio (target: all
succeed, p99 <= 2x); every tenant's completed choices and completion tokens against the signed
usage rows the gateway stored; every 429 and 401 the clients saw against the gateway's audit log
(admission and edge refusals are both aggregated: entries plus summary counts).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from sealed_bench.processes import REPO, source_pythonpath
from sealed_bench.rawload import Tally, plain_get, stream_once

TENANTS = ("quiet", "bulk", "flood")
MODEL = "m"


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


async def _quiet_client(url: str, key: str, requests: int, concurrency: int, tokens: int) -> dict[str, Any]:
    """The quiet tenant (its own process): TTFT of each streamed request, None when it failed."""
    import anyio
    import httpx

    body = {"model": MODEL, "prompt": "hello", "max_tokens": tokens, "stream": True}
    sem = asyncio.Semaphore(concurrency)
    ttfts: list[float | None] = []
    statuses: dict[str, int] = {}

    async def one(client: httpx.AsyncClient) -> None:
        async with sem:
            started, done = time.perf_counter(), False
            ttft: float | None = None
            status: int | str = "error"  # the HTTP status, or the client's error
            try:
                async with client.stream("POST", "/v1/completions", json=body,
                                         headers={"Authorization": f"Bearer {key}"}) as r:
                    status = r.status_code
                    async for line in r.aiter_lines():
                        if line.startswith("data: ") and ttft is None:
                            ttft = time.perf_counter() - started
                        done = done or line == "data: [DONE]"
            except httpx.HTTPError as exc:
                status = type(exc).__name__
            ok = status == 200 and done
            statuses[str(status if ok or status != 200 else "incomplete")] = statuses.get(
                str(status if ok or status != 200 else "incomplete"), 0) + 1
            ttfts.append(ttft if ok else None)

    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        # httpx imports its async backend (anyio's, ~30 modules: 33 ms on an idle machine, 2-3x that
        # on a loaded one) at its first request. Load it before any clock starts, so that the first
        # request measures what the gateway does and the connection it opens, not this client's imports.
        await anyio.sleep(0)
        await asyncio.gather(*(one(client) for _ in range(requests)))
    return {"ttfts": ttfts, "statuses": statuses}


async def quiet_run(url: str, key: str, args: argparse.Namespace) -> dict[str, Any]:
    config = json.dumps({"url": url, "key": key, "requests": args.quiet_requests,
                         "concurrency": args.quiet_concurrency, "tokens": args.quiet_tokens})
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "sealed_bench.bench_flood", "--quiet-client",
                                                config, stdout=asyncio.subprocess.PIPE)
    out, _ = await proc.communicate()
    summary: dict[str, Any] = json.loads(out)  # _quiet_client's answer
    return summary


async def load(args: argparse.Namespace, url: str, keys: dict[str, str]) -> dict[str, Any]:
    host, port = url.removeprefix("http://").split(":")
    baseline = await quiet_run(url, keys["quiet"], args)
    tallies = {t: Tally() for t in ("bulk", "flood")}
    unauthorized: dict[str, int] = {}
    stop = asyncio.Event()
    bulk_body = {"model": MODEL, "prompt": "bulk", "max_tokens": args.stream_tokens}
    flood_body = {"model": MODEL, "prompt": ["flood"] * 16, "n": 4, "max_tokens": args.flood_max_tokens}

    async def keep(tenant: str, body: dict, choices: int) -> None:
        while not stop.is_set():
            if not await stream_once(host, int(port), "/v1/completions", keys[tenant], body, choices, tallies[tenant]):
                await asyncio.sleep(0.05)  # refused (429): the flooder retries at once, nearly

    async def guesser() -> None:
        for i in range(args.unauthorized):
            if stop.is_set():
                break
            status = await plain_get(host, int(port), "/v1/models", f"sk-guess-{i}")
            unauthorized[str(status)] = unauthorized.get(str(status), 0) + 1
            await asyncio.sleep(0.02)

    tasks = [asyncio.create_task(keep("bulk", bulk_body, 1)) for _ in range(args.streams)]
    tasks += [asyncio.create_task(keep("flood", flood_body, 64)) for _ in range(args.flood_concurrency)]
    await asyncio.sleep(args.warmup_s)
    tasks.append(asyncio.create_task(guesser()))
    loaded_started, load_before = time.perf_counter(), os.getloadavg()
    loaded = await quiet_run(url, keys["quiet"], args)
    loaded_s, load_after = time.perf_counter() - loaded_started, os.getloadavg()
    stop.set()
    await asyncio.gather(*tasks)  # every open stream ends normally: usage can be compared exactly
    ok_base = [t for t in baseline["ttfts"] if t is not None]
    ok_loaded = [t for t in loaded["ttfts"] if t is not None]
    p99_base, p99_loaded = _pct(ok_base, 99), _pct(ok_loaded, 99)
    return {
        "quiet": {"requests": args.quiet_requests, "succeeded_alone": len(ok_base), "succeeded_loaded": len(ok_loaded),
                  "ttft_alone_ms": {"p50": 1000 * (statistics.median(ok_base) if ok_base else 0),
                                    "p99": 1000 * (p99_base or 0)},
                  "ttft_loaded_ms": {"p50": 1000 * (statistics.median(ok_loaded) if ok_loaded else 0),
                                     "p99": 1000 * (p99_loaded or 0)},
                  "p99_ratio": (p99_loaded / p99_base) if p99_base and p99_loaded else None,
                  # In request order (None: failed), so an outlier can be told apart (the first
                  # request opens a connection; later ones reuse it).
                  "ttft_alone_each_ms": [None if t is None else round(1000 * t, 1) for t in baseline["ttfts"]],
                  "ttft_loaded_each_ms": [None if t is None else round(1000 * t, 1) for t in loaded["ttfts"]],
                  "loaded_phase_s": loaded_s, "statuses_alone": baseline["statuses"],
                  "statuses_loaded": loaded["statuses"]},
        "loadavg_during_loaded_phase": {"start": load_before, "end": load_after},
        "statuses": {t: tallies[t].status for t in tallies}, "unauthorized": unauthorized,
        "choices_completed": {"quiet": 2 * args.quiet_requests - sum(
            1 for r in (baseline, loaded) for t in r["ttfts"] if t is None),
            **{t: tallies[t].choices_done for t in tallies}},
    }


def _spawn(args: list[str], log: Path) -> subprocess.Popen:
    # From the checkout (the stand-in workers are tests/api/fake_worker.py), wherever this was started.
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": source_pythonpath(os.environ.get("PYTHONPATH", ""))}
    return subprocess.Popen([sys.executable, "-m", *args], stdout=open(log, "ab"), cwd=REPO,
                            stderr=subprocess.STDOUT, env=env)


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
    store.ensure_tenant("flood", rpm=args.flood_rpm, max_queued=args.flood_max_queued)  # its own limits
    keys = {t: store.create_key(t, "bench")[0] for t in TENANTS}
    (root / "routes.json").write_text(json.dumps([{"tenant": t, "model": MODEL, "version": "v1"} for t in TENANTS]))
    token = root / "register-token"
    token.write_text("bench-register-token-" + "x" * 32)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    procs = [_spawn(["api.gateway", "--data-dir", str(data), "--routes", str(root / "routes.json"), "--port",
                     str(port), "--dev", "--register-token-file", str(token), "--max-inflight",
                     str(args.max_inflight), "--http", args.http, "--loop", args.loop, "--adaptive-lag",
                     str(args.adaptive_lag)],
                    root / "gateway.log")]
    try:
        for t in TENANTS:
            procs.append(_spawn(["tests.api.fake_worker", "--gateway", url, "--token-file", str(token), "--tenant", t,
                                 "--model", MODEL, "--grpc-port", str(free_port()), "--http-port", str(free_port()),
                                 "--delay", str(args.token_delay)], root / f"worker-{t}.log"))
        import httpx

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
        procs[0].send_signal(signal.SIGTERM)  # the gateway writes its last audit summaries as it stops
        procs[0].wait(60)
        result.update(_accounting(args, store, root / "audit", result))
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
    return result


def _accounting(args: argparse.Namespace, store: Any, audit_dir: Path, result: dict[str, Any]) -> dict[str, Any]:
    """Signed usage against what the clients got; the audit log against every refusal they saw."""
    from policy.audit import read_entries

    tokens = {"quiet": args.quiet_tokens, "bulk": args.stream_tokens, "flood": args.flood_max_tokens}
    usage = {t: store.usage_summary(t) for t in TENANTS}
    rows = {t: sum(r["requests"] for r in usage[t]) for t in TENANTS}
    served = {t: sum(r["completion_tokens"] for r in usage[t]) for t in TENANTS}
    expected = {t: result["choices_completed"][t] * tokens[t] for t in TENANTS}
    entries = read_entries(audit_dir)
    # Admission refusals are aggregated like edge refusals: the first of each kind per window in full,
    # the rest counted in `admission-summary` entries (api/gateway/tickets.py).
    admission = {t: sum(1 if e.action == "admission" else int(e.metadata.get("count") or 0) for e in entries
                        if e.tenant == t and e.action in ("admission", "admission-summary")) for t in TENANTS}
    refused = {t: sum(n for s, n in result["statuses"].get(t, {}).items() if s in ("429", "400"))
               for t in ("bulk", "flood")}
    edge_401 = sum(1 if e.action == "edge-refusal" else int(e.metadata.get("count") or 0) for e in entries
                   if e.action in ("edge-refusal", "edge-refusal-summary") and e.metadata.get("status") == 401)
    return {"usage_rows": rows, "usage_exact": rows == result["choices_completed"],
            "completion_tokens": {"usage": served, "served": expected}, "tokens_exact": served == expected,
            "audit": {"entries": len(entries), "admission_refusals": admission, "refusals_seen": refused,
                      "unauthorized_seen": result["unauthorized"].get("401", 0), "unauthorized_audited": edge_401,
                      "edge_entries": sum(1 for e in entries if e.action.startswith("edge-refusal")),
                      "admission_entries": sum(1 for e in entries if e.action.startswith("admission"))},
            "audit_exact": all(admission[t] == refused[t] for t in refused) and admission["quiet"] == 0
            and edge_401 == result["unauthorized"].get("401", 0)}


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
    parser.add_argument("--adaptive-lag", type=float, default=0.005,
                        help="the gateway's --adaptive-lag (0: fixed --max-inflight slots)")
    parser.add_argument("--warmup-s", type=float, default=5.0, help="load before the quiet tenant starts")
    parser.add_argument("--flood-rpm", type=int, default=120, help="the flooding tenant's requests per minute")
    parser.add_argument("--flood-max-queued", type=int, default=4, help="the flooding tenant's queue bound")
    parser.add_argument("--unauthorized", type=int, default=300, help="requests with unknown keys (401s)")
    parser.add_argument("--http", choices=("auto", "httptools", "h11"), default="auto",
                        help="the gateway's HTTP parser (auto: httptools when installed)")
    parser.add_argument("--loop", choices=("auto", "uvloop", "asyncio"), default="auto",
                        help="the gateway's event loop (auto: asyncio's with priorities)")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--quiet-client", default=None, help=argparse.SUPPRESS)  # the quiet tenant's process
    args = parser.parse_args(argv)
    if args.quiet_client:
        c = json.loads(args.quiet_client)
        print(json.dumps(asyncio.run(_quiet_client(c["url"], c["key"], c["requests"], c["concurrency"],
                                                   c["tokens"]))))
        return 0
    result = run(args)
    quiet = result["quiet"]
    result["targets"] = {"quiet_all_succeeded": quiet["succeeded_loaded"] == quiet["requests"],
                         "quiet_p99_within_2x": quiet["p99_ratio"] is not None and quiet["p99_ratio"] <= 2.0,
                         "usage_exact": result["usage_exact"], "tokens_exact": result["tokens_exact"],
                         "audit_exact": result["audit_exact"]}
    result["parameters"] = vars(args) | {"json": str(args.json) if args.json else None}
    from api.http_server import event_loop

    result["gateway_loop"] = event_loop(args.loop)  # what `auto` resolved to in this environment
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
