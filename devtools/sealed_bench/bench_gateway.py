"""`sealed bench gateway`: the gateway's fixed cost per request, in process, no network, no worker.

    sealed bench gateway --requests 2000 --json out.json
    sealed bench gateway --requests 2000 --profile search     (cProfile's top costs of one endpoint)

Builds the app as the tests do (`build_gateway` + `create_app`, SQLite control plane in a temporary
directory, the audit log on) and sends it requests through httpx's ASGI transport on one event loop:
GET /v1/models, GET /v1/vector_stores/{id} (authorization, the row) and POST .../search, whose
worker is stubbed at the gRPC seam only (`WorkerClients.unary` answers a canned SearchStoreReply):
routing, middleware, dependencies, authorization, admission, the row, audit and JSON encoding are
the gateway's own (the delivery probe is off: nothing listens at the stub worker's address).
Reported per endpoint: p50, p99 and mean in ms. No assertions.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import json
import os
import pstats
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ENDPOINTS = ("models", "store", "search")


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _ok(name: str, response: Any) -> None:
    if response.status_code != 200:  # a refusal would time the error path, not the request
        raise RuntimeError(f"{name}: {response.status_code} {response.text[:200]}")


async def _run(data_dir: Path, requests: int, warmup: int, profile: str | None) -> dict[str, Any]:
    import httpx

    from api.app import build_gateway, create_app
    from api.gateway.registry import WorkerInfo
    from api.gateway.settings import GatewaySettings
    from api.store.retrieval import RetrievalStore
    from protocol.model_ref import ModelRef
    from protocol.rpc import worker_pb2

    # No delivery probe: its worker here is an address nothing listens on (its reconnects would be noise).
    settings = GatewaySettings(data_dir=data_dir, dev=True, heartbeat_timeout_s=1e9, adaptive_lag_s=None)
    service = build_gateway(settings)
    app = create_app(settings, service)
    secret, _ = service.store.create_key("acme", "bench", rpm=10**9)
    store = RetrievalStore(service.store.sessions).put_store(
        store_id="vs-bench", tenant="acme", name="bench", metadata={}, model="m", version="v1")
    registry = service.registry
    registry.workers["w"] = WorkerInfo("w", "127.0.0.1:1", ModelRef("acme", "m", "v1"), "ready", "sim", True, "",
                                       last_seen=registry.clock.now())
    results = json.dumps([{"file_id": "file-1", "filename": "a.txt", "score": 0.9, "attributes": {},
                           "content": [{"type": "text", "text": "x" * 400}]}])

    async def unary(address: str, worker_cert: str, method: str, request: Any, timeout_s: float) -> Any:
        return worker_pb2.SearchStoreReply(results_json=results, file_ids=["file-1"])

    service.clients.unary = unary  # type: ignore[method-assign]  # the gRPC seam, nothing above it
    headers = {"Authorization": f"Bearer {secret}"}
    calls = {
        "models": ("GET", "/v1/models", None),
        "store": ("GET", f"/v1/vector_stores/{store.id}", None),
        "search": ("POST", f"/v1/vector_stores/{store.id}/search", {"query": "how do I load a model"}),
    }
    report: dict[str, Any] = {}
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as client:
            for name, (method, path, body) in calls.items():
                if profile is not None and name != profile:
                    continue
                for _ in range(warmup):
                    _ok(name, await client.request(method, path, headers=headers, json=body))
                profiler = cProfile.Profile() if profile else None
                times: list[float] = []
                if profiler is not None:
                    profiler.enable()
                for _ in range(requests):
                    t0 = time.perf_counter()
                    r = await client.request(method, path, headers=headers, json=body)
                    times.append((time.perf_counter() - t0) * 1000)
                    _ok(name, r)
                if profiler is not None:
                    profiler.disable()
                    out = io.StringIO()
                    pstats.Stats(profiler, stream=out).sort_stats("cumulative").print_stats(45)
                    pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(25)
                    print(out.getvalue())
                report[name] = {"requests": requests, "p50_ms": round(statistics.median(times), 3),
                                "p99_ms": round(_percentile(times, 0.99), 3),
                                "mean_ms": round(statistics.fmean(times), 3)}
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sealed bench gateway", description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=2000, help="timed requests per endpoint")
    parser.add_argument("--warmup", type=int, default=100, help="untimed requests per endpoint first")
    parser.add_argument("--profile", choices=ENDPOINTS, default=None,
                        help="profile this endpoint only (cProfile: the timings then include its overhead)")
    parser.add_argument("--json", type=Path, default=None, help="write the report here")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-gateway-") as tmp:
        (Path(tmp) / "data").mkdir()
        report = asyncio.run(_run(Path(tmp) / "data", args.requests, args.warmup, args.profile))
    report["load_average"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(report, indent=2))
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
