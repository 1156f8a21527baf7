"""Console benchmark: server-side page render time with a large audit log (target p95 <= 300 ms).

Run: ``sealed bench console [--entries 100000] [--repeat 40] [--json FILE]``. Writes an audit
directory of N signed, hash-chained entries (three components, many tenants, checkpoints every
1,000), starts the gateway with its console on localhost (uvicorn), logs in, waits until the
console has indexed and fully verified the log, then times each page and export over loopback
(request sent to last byte read: an upper bound of the server's time). No assertions here: the
numbers are reported, docs/benchmarks.md records them with the machine.
"""

from __future__ import annotations

import argparse
import json
import secrets
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from api.app import build_gateway, create_app
from api.console.state import bound_console
from api.console_settings import ConsoleSettings
from api.gateway.settings import GatewaySettings
from api.management.auth import issue_token
from api.stack import free_port
from policy.audit import AuditLog
from sealed_bench.bench_policy import machine

COMPONENTS = ("key-broker", "gateway", "worker")
RULES = ("admission.allow", "admission.rate_limit", "admission.token_budget", "release.allow",
         "release.measurement", "data.pii_block", "agent.tools", "agent.kill_switch")


def write_audit(directory: Path, entries: int, tenants: int) -> float:
    """N entries spread over three component logs; returns seconds spent writing."""
    started = time.perf_counter()
    (directory / "keys").mkdir(parents=True, exist_ok=True)
    logs = []
    for component in COMPONENTS:
        key = Ed25519PrivateKey.generate()
        (directory / "keys" / f"{component}.pem").write_bytes(key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
        logs.append(AuditLog(directory / f"{component}.audit.jsonl", key, component, checkpoint_every=1000))
    for i in range(entries):
        rule = RULES[i % len(RULES)]
        logs[i % len(logs)].append(
            tenant=f"tenant-{i % tenants:02d}", action=rule.split(".")[0], decision="deny" if i % 7 == 0 else "allow",
            reason="bench", metadata={"rule": rule, "model": "chat", "request": i})
    for log in logs:
        log.close()
    return time.perf_counter() - started


def _percentiles(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)

    def pick(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000

    return {"p50_ms": round(pick(0.50), 1), "p95_ms": round(pick(0.95), 1), "p99_ms": round(pick(0.99), 1),
            "mean_ms": round(statistics.fmean(ordered) * 1000, 1), "n": len(ordered)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sealed bench console", description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=100_000, help="audit entries in the log")
    parser.add_argument("--tenants", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=40, help="requests per page")
    parser.add_argument("--dir", type=Path, default=None, help="where to write the audit log (default: tmp)")
    parser.add_argument("--json", type=Path, default=None, help="write results as JSON to this file")
    args = parser.parse_args(argv)
    results: dict[str, Any] = {"machine": machine(), "entries": args.entries, "tenants": args.tenants,
                               "repeat": args.repeat, "pages": {}}
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        root = Path(tmp)
        results["write_s"] = round(write_audit(root / "audit", args.entries, args.tenants), 2)
        secret = secrets.token_urlsafe(48)
        # Plain HTTP on loopback: the session cookie is Secure otherwise, and the client would not send it back.
        console = ConsoleSettings(audit_dir=root / "audit", unsafe_plain_http_loopback=True)
        settings = GatewaySettings(data_dir=root / "gateway", dev=True, jwt_secret=secret, console=console)
        (root / "gateway").mkdir()
        service = build_gateway(settings)
        app = create_app(settings, service)
        for n in range(args.tenants):
            service.store.ensure_tenant(f"tenant-{n:02d}", token_budget=10**6)
        port = free_port()
        server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
        threading.Thread(target=server.run, daemon=True).start()
        url = f"http://127.0.0.1:{port}"
        while True:
            try:
                httpx.get(f"{url}/healthz", timeout=1.0)
                break
            except httpx.HTTPError:
                time.sleep(0.05)
        sessions = {}
        for role, tenant in (("auditor", None), ("tenant-admin", "tenant-03")):
            client = httpx.Client(base_url=url, timeout=600.0)
            login = client.post("/console/login", data={"token": issue_token(secret, f"{role}@bench", role, tenant)})
            if login.status_code != 303 or not client.cookies:
                raise SystemExit(f"console login as {role}: HTTP {login.status_code}, no session")
            sessions[role] = client
        started = time.perf_counter()
        first = sessions["auditor"].get("/console/audit")
        results["first_render_s"] = round(time.perf_counter() - started, 2)  # index build (chain, hashes)
        index = bound_console(app).index
        if index is None:  # the settings above name an audit directory
            raise SystemExit("the console has no audit index")
        while any(s.signatures_pending for s in index.statuses()):
            time.sleep(0.2)
        results["full_verification_s"] = round(time.perf_counter() - started, 2)  # + every signature
        results["intact"] = first.status_code == 200 and all(s.broken is None for s in index.statuses())
        pages = {
            "audit (auditor, newest page)": ("auditor", "/console/audit"),
            "audit (auditor, page 1000)": ("auditor", "/console/audit?page=1000"),
            "audit (auditor, tenant + rule + role filter)":
                ("auditor", "/console/audit?tenant=tenant-07&rule=agent.tools&component=worker"),
            "audit (auditor, time window)": ("auditor", "/console/audit?since=2000-01-01T00:00&until=2100-01-01"),
            "audit (tenant admin)": ("tenant-admin", "/console/audit"),
            "workers": ("auditor", "/console/workers"),
            "keys (tenant admin)": ("tenant-admin", "/console/keys"),
            "usage": ("auditor", "/console/usage"),
            "policies": ("auditor", "/console/policies"),
        }
        for name, (role, path) in pages.items():
            samples = []
            for _ in range(args.repeat):
                t = time.perf_counter()
                response = sessions[role].get(path)
                samples.append(time.perf_counter() - t)
                if response.status_code != 200:
                    raise SystemExit(f"{path}: HTTP {response.status_code}")
            results["pages"][name] = _percentiles(samples)
        exports = {}
        for fmt in ("jsonl", "csv", "ocsf"):
            t = time.perf_counter()
            body = sessions["tenant-admin"].get(f"/console/audit/export.{fmt}").content
            exports[fmt] = {"seconds": round(time.perf_counter() - t, 3), "bytes": len(body)}
        results["exports (one tenant)"] = exports
        for client in sessions.values():
            client.close()
        server.should_exit = True
    print(f"{args.entries} audit entries: written in {results['write_s']} s; first render "
          f"{results['first_render_s']} s, fully verified after {results['full_verification_s']} s; "
          f"intact={results['intact']}")
    for name, r in results["pages"].items():
        print(f"{name:46s} p50 {r['p50_ms']:7.1f} ms  p95 {r['p95_ms']:7.1f} ms  p99 {r['p99_ms']:7.1f} ms")
    for fmt, r in results["exports (one tenant)"].items():
        print(f"export {fmt:5s} (one tenant) {r['seconds']:.3f} s, {r['bytes']} bytes")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
