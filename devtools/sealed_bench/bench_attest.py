"""`sealed bench attest --json FILE`: verification latency per TEE with cached chains.

Targets on the 2-core dev machine: SNP p50 <= 2 ms, TDX p50 <= 5 ms.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


def _percentiles(run: Callable[[], object], iterations: int, warmup: int = 20) -> dict[str, float]:
    for _ in range(warmup):
        run()
    samples = []
    for _ in range(iterations):
        start = time.perf_counter()
        run()
        samples.append((time.perf_counter() - start) * 1000.0)
    samples.sort()
    return {"iterations": iterations, "p50_ms": statistics.median(samples),
            "p99_ms": samples[int(0.99 * (len(samples) - 1))], "mean_ms": statistics.fmean(samples)}


def _vectors() -> Path | None:
    path = Path(os.environ.get("SEALED_TESTVECTORS", REPO / "tests" / "vectors" / "attestation"))
    return path if path.is_dir() else None


def bench_snp(iterations: int) -> dict[str, Any]:
    from sealed_fakes import snp_bench as bench_support

    vectors = _vectors()
    if vectors is not None:
        verify = bench_support.make_cached_verifier(
            (vectors / "snp" / "gosevguest_milan_vcek.der").read_bytes(),
            now=dt.datetime(2022, 9, 24, 1, tzinfo=dt.UTC))
        report, case = (vectors / "snp" / "gosevguest_milan_attestation.bin").read_bytes(), "real Milan v2 report"
    else:
        verify, report = bench_support.synthetic_case(2048)
        case = "synthetic Milan v3 report (test roots)"
    return {"tee": "snp", "case": case, "target_p50_ms": 2.0, **_percentiles(lambda: verify(report), iterations)}


def bench_tdx(iterations: int) -> dict[str, Any]:
    from sealed_fakes import tdx_bench as bench_support

    vectors = _vectors()
    case = bench_support.vector_case(vectors) if vectors is not None else bench_support.synthetic_case()
    return {"tee": "tdx", "case": case.name, "target_p50_ms": 5.0,
            **_percentiles(bench_support.prepare(case), iterations)}


def bench_sim(iterations: int) -> dict[str, Any]:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from attestation.bundle import EvidenceBundle, RuntimeData, expected_report_data
    from attestation.sim import SimTee
    from attestation.verifier import VerifierTrust, verify_bundle

    key = Ed25519PrivateKey.generate()
    runtime = RuntimeData(os.urandom(32), os.urandom(32))
    bundle = EvidenceBundle("sim", SimTee(key, bytes(48)).get_report(expected_report_data(runtime, ())), runtime)
    trust, now = VerifierTrust(sim_platform_key=key.public_key()), dt.datetime.now(dt.UTC)
    return {"tee": "sim", "case": "simulated TEE bundle", **_percentiles(
        lambda: verify_bundle(bundle, expected_nonce=runtime.nonce, now=now, trust=trust), iterations)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sealed bench attest")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--iterations", type=int, default=500)
    args = parser.parse_args(argv)
    rows = [bench(args.iterations) for bench in (bench_snp, bench_tdx, bench_sim)]
    result = {"benchmark": "attest", "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                                                 "python": platform.python_version()}, "rows": rows}
    for row in rows:
        target = row.get("target_p50_ms")
        verdict = "" if target is None else (" (meets target)" if row["p50_ms"] <= target else " (MISSES target)")
        print(f"{row['tee']:4} {row['case']}: p50 {row['p50_ms']:.3f} ms, p99 {row['p99_ms']:.3f} ms{verdict}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
