"""The TDX benchmark case and `sealed bench attest`'s TDX timing stay runnable (no timing
assertions: the numbers are for `sealed bench attest`)."""

from __future__ import annotations

from pathlib import Path

from attestation.claims import TcbStatus
from sealed_bench.bench_attest import bench_tdx
from sealed_fakes import tdx_bench as bench_support


def test_synthetic_case_runs() -> None:
    case = bench_support.synthetic_case()
    verified = bench_support.prepare(case)()
    assert verified.tcb is not None and verified.tcb.status is TcbStatus.UP_TO_DATE
    stats = bench_tdx(iterations=5)  # what `sealed bench attest` times, end to end
    assert set(stats) >= {"p50_ms", "p99_ms", "mean_ms"} and stats["iterations"] == 5


def test_vector_case_runs(testvectors: Path) -> None:
    verified = bench_support.prepare(bench_support.vector_case(testvectors))()
    assert verified.tcb is not None and verified.tcb.status is TcbStatus.UP_TO_DATE and verified.crls_checked
