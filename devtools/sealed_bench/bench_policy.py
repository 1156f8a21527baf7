"""Policy benchmark: decision latency (p50/p99 per control) and audit append throughput.

Run: ``sealed bench policy`` or ``python sealed_bench/bench_policy.py --json out.json``.
Targets (docs/policy.md): decision p99 <= 1 ms; audit append >= 5,000 events/s with durable
batching. No assertions here: the numbers are reported, the docs record them with the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from policy import (
    AdmissionFacts,
    PolicySet,
    ReleaseFacts,
    ReleasePolicy,
    evaluate_admission,
    evaluate_release,
)
from policy.agents import SessionState, ToolCall, check_tool_calls
from policy.audit import AuditLog, verify_log
from policy.data import check_content

POLICY = {
    "policy_id": "bench", "version": 1, "tenant": "acme",
    "admission": {"allowed_models": ["llama", "qwen"], "max_context_tokens": 8192, "max_output_tokens": 1024,
                  "requests_per_minute": 600, "tokens_per_day": 10**9},
    "key_overrides": {f"k{i}": {"max_output_tokens": 4096} for i in range(20)},
    "data": {"pii_input": {"CREDIT_CARD": "block", "EMAIL_ADDRESS": "redact"},
             "pii_output": {"PHONE_NUMBER": "redact"}, "blocked_patterns": {"codename": "(?i)nightingale"},
             "blocked_topics": {"weapons": ["nerve agent"]}},
    "agents": {"a1": {"max_calls_per_request": 8, "max_calls_per_session": 10**6, "tools": {
        "fetch": {"url_args": ["url"], "allowed_domains": ["example.com", "*.example.org"],
                  "args_schema": {"type": "object", "properties": {"url": {"type": "string"}},
                                  "required": ["url"]}},
        "send_email": {"requires_approval": True}}}},
}


def _latency(fn: Callable[[], object], n: int) -> dict[str, float]:
    for _ in range(min(200, n)):
        fn()  # warm caches (compiled policies, validators)
    samples, cpu = [], []
    for _ in range(n):
        t, c = time.perf_counter(), time.thread_time()
        fn()
        cpu.append(time.thread_time() - c)
        samples.append(time.perf_counter() - t)
    samples.sort()
    cpu.sort()
    # Wall time includes being descheduled on a busy machine; thread CPU time is the work itself.
    return {"n": n, "p50_us": samples[n // 2] * 1e6, "p99_us": samples[int(n * 0.99) - 1] * 1e6,
            "mean_us": statistics.fmean(samples) * 1e6, "cpu_p50_us": cpu[n // 2] * 1e6,
            "cpu_p99_us": cpu[int(n * 0.99) - 1] * 1e6}


def bench_decisions(n: int) -> dict[str, dict[str, float]]:
    ps = PolicySet.from_dict(POLICY)
    rp = ReleasePolicy(policy_id="rel", version=1, tenant="acme", model="llama",
                       allowed_tee=frozenset({"snp", "tdx"}), allowed_measurements=frozenset({"ab" * 48}),
                       min_tcb={"snp": 7, "microcode": 200}, require_gpu_cc=True)
    rf = ReleaseFacts("acme", "llama", "v1", "snp", "ab" * 48, False, {"snp": 8, "microcode": 210}, True,
                      False, None)
    af = AdmissionFacts("acme", "k3", "llama", 1000, 2000)
    session = SessionState("bench")
    calls = [ToolCall("fetch", '{"url": "https://api.example.org/v1?q=1"}')]
    prompt = "Please summarise the attached report and email it to a@b.com by Friday. " * 4
    return {
        "admission": _latency(lambda: evaluate_admission(ps, af), n),
        "release": _latency(lambda: evaluate_release(rp, rf), n),
        "tool_call": _latency(lambda: check_tool_calls(ps, "a1", session, calls), n),
        "content_input_300ch": _latency(lambda: check_content(ps, "k1", "llama", prompt), n),
    }


def bench_audit(directory: Path, events: int, mode: str, threads: int) -> dict[str, Any]:
    key = Ed25519PrivateKey.generate()
    path = directory / f"bench-{mode}-{threads}.audit.jsonl"
    log = AuditLog(path, key, "bench", fsync=mode)
    per_thread = events // threads

    def work() -> None:
        for i in range(per_thread):
            log.append(tenant="acme", action="admission", decision="allow", reason="admission.permit",
                       metadata={"api_key_id": "k1", "model": "llama", "tokens": i})

    t, c = time.perf_counter(), time.process_time()
    workers = [threading.Thread(target=work) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    log.flush()  # durable: the clock stops only once everything is fsynced
    elapsed, cpu = time.perf_counter() - t, time.process_time() - c
    log.close()
    report = verify_log(path, {"bench": key.public_key()})
    return {"mode": mode, "threads": threads, "events": per_thread * threads, "seconds": elapsed,
            "events_per_s": per_thread * threads / elapsed, "cpu_seconds": cpu,
            "events_per_cpu_s": per_thread * threads / cpu, "verified_entries": report.entries}


def machine() -> dict[str, Any]:
    model = ""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        model = next((ln.split(":", 1)[1].strip() for ln in cpuinfo.read_text().splitlines()
                      if ln.startswith("model name")), "")
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    return {"python": platform.python_version(), "platform": platform.platform(),
            "cpu_model": model or platform.machine(), "cpus": os.cpu_count(), "loadavg": load}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sealed bench policy", description=__doc__.splitlines()[0])
    parser.add_argument("--decisions", type=int, default=3000, help="samples per decision type")
    parser.add_argument("--events", type=int, default=20000, help="audit events per run")
    parser.add_argument("--dir", type=Path, default=None, help="where to write audit logs (default: tmp)")
    parser.add_argument("--json", type=Path, default=None, help="write results as JSON to this file")
    args = parser.parse_args(argv)
    results: dict[str, Any] = {"machine": machine(), "decisions": bench_decisions(args.decisions),
                               "audit": []}
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        for mode, threads in (("batch", 1), ("group", 8), ("always", 1)):
            events = args.events if mode != "always" else max(1, args.events // 20)
            results["audit"].append(bench_audit(Path(tmp), events, mode, threads))
    for name, r in results["decisions"].items():
        print(f"decision {name:20s} wall p50 {r['p50_us']:7.1f} us p99 {r['p99_us']:8.1f} us | "
              f"cpu p50 {r['cpu_p50_us']:7.1f} us p99 {r['cpu_p99_us']:7.1f} us")
    for r in results["audit"]:
        print(f"audit fsync={r['mode']:6s} threads={r['threads']}  {r['events_per_s']:8.0f} events/s wall, "
              f"{r['events_per_cpu_s']:8.0f} events/CPU-s ({r['events']} events, {r['seconds']:.2f} s, "
              f"verified {r['verified_entries']})")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
