"""`sealed bench serve --sealed`: the paired runs' bookkeeping (order, CPU accounting, costs) and the
mapping of `vllm bench serve`'s result; no figure is asserted, only the arithmetic on given ones."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from sealed_bench.serve_pairs import CpuMeter, paired
from sealed_bench.vllm_client import _summary


def _summary_for(throughput: float, ttft_ms: float) -> dict[str, Any]:
    stats = {"mean": ttft_ms, "median": ttft_ms, "p99": ttft_ms}
    return {"completed": 10, "failed": 0, "output_throughput": throughput, "ttft_ms": stats,
            "tpot_ms": {"mean": 50.0, "median": 50.0, "p99": 60.0}}


def test_pairs_alternate_and_costs_are_taken_per_pair() -> None:
    order: list[str] = []
    figures = iter([(100.0, 200.0), (98.0, 203.0),   # pair 1: plaintext, sealed
                    (90.0, 210.0), (91.0, 209.0),    # pair 2: sealed first, then plaintext
                    (100.0, 200.0), (99.0, 201.0)])  # pair 3: plaintext, sealed

    def run(label: str, mark: Callable[[], None]) -> dict[str, Any]:
        order.append(label)
        mark()
        return _summary_for(*next(figures))

    report = paired(run, 3, CpuMeter({"client": [os.getpid()]}), lambda *_: None)
    assert order == ["plaintext", "sealed", "sealed", "plaintext", "plaintext", "sealed"]
    costs = [round(c["throughput_pct"], 3) for c in report["pairs"]]
    assert costs == [2.0, round(100 * (1 - 90 / 91), 3), 1.0]
    assert [c["ttft_p50_ms"] for c in report["pairs"]] == [3.0, 1.0, 1.0]
    cost = report["sealed_cost"]
    assert cost["throughput_pct"]["median"] == report["pairs"][1]["throughput_pct"]
    assert round(cost["throughput_pct"]["min"], 9) == 1.0 and cost["ttft_p50_ms"]["min"] == 1.0
    assert round(cost["throughput_pct_best"], 3) == 1.0  # 99 against 100
    assert all(r["cpu_ms_per_request"]["client"] >= 0 for r in report["runs"])
    assert all(len(r["loadavg_1m"]) == 2 for r in report["runs"])


def test_vllm_results_map_to_the_same_shape() -> None:
    result = {"completed": 8, "failed": 0, "duration": 4.0, "total_input_tokens": 256, "total_output_tokens": 64,
              "request_throughput": 2.0, "output_throughput": 16.0, "total_token_throughput": 80.0,
              "mean_ttft_ms": 12.0, "median_ttft_ms": 11.0, "p99_ttft_ms": 20.0, "median_tpot_ms": 7.0,
              "errors": ["", ""]}
    summary = _summary(result)
    assert summary["ttft_ms"] == {"mean": 12.0, "median": 11.0, "p99": 20.0}
    assert summary["tpot_ms"]["median"] == 7.0 and summary["output_throughput"] == 16.0
    assert summary["errors"] == [] and summary["client"] == "vllm bench serve"


def test_mixed_pairs_run_both_modes_at_once_and_swap_who_starts() -> None:
    from sealed_bench.serve_pairs import paired_mixed

    firsts: list[str] = []

    def run_both(first: str, mark: Callable[[], None]) -> dict[str, Any]:
        firsts.append(first)
        mark()
        return {"plaintext": _summary_for(100.0, 200.0), "sealed": _summary_for(97.0, 204.0)}

    report = paired_mixed(run_both, 3, CpuMeter({"client": [os.getpid()]}), lambda *_: None)
    assert firsts == ["plaintext", "sealed", "plaintext"]
    assert [round(c["throughput_pct"], 6) for c in report["pairs"]] == [3.0, 3.0, 3.0]
    assert report["sealed_cost"]["ttft_p50_ms"]["median"] == 4.0
    assert all("client" in r["cpu_ms_per_request_both_modes"] for r in report["runs"])


def test_pairs_of_other_labels_measure_each_with_its_own_meter() -> None:
    """`--tracing-sample`: tracing off against on, two deployments; each run counts its own CPU."""
    order: list[str] = []
    asked: list[str] = []
    figures = iter([(100.0, 200.0), (97.0, 202.0), (98.0, 201.0), (100.0, 200.0)])

    def run(label: str, mark: Callable[[], None]) -> dict[str, Any]:
        order.append(label)
        mark()
        return _summary_for(*next(figures))

    def meter(label: str) -> CpuMeter:
        asked.append(label)
        return CpuMeter({"client": [os.getpid()]})

    report = paired(run, 2, meter, lambda *_: None, ("tracing_off", "tracing_on"))
    assert order == asked == ["tracing_off", "tracing_on", "tracing_on", "tracing_off"]
    cost = report["tracing_on_cost"]
    assert [round(c["throughput_pct"], 6) for c in report["pairs"]] == [3.0, 2.0]
    assert round(cost["throughput_pct"]["median"], 6) == 2.5 and "sealed_cost" not in report
    assert {r["mode"] for r in report["runs"]} == {"tracing_off", "tracing_on"}


def test_mixed_pairs_of_two_deployments_give_each_mode_its_own_cpu() -> None:
    from sealed_bench.serve_pairs import paired_mixed

    firsts: list[str] = []
    labels = ("tracing_off", "tracing_on")

    def run_both(first: str, mark: Callable[[], None]) -> dict[str, Any]:
        firsts.append(first)
        mark()
        return {"tracing_off": _summary_for(100.0, 200.0), "tracing_on": _summary_for(99.0, 201.0)}

    meter = CpuMeter({"tracing_off.client": [os.getpid()], "tracing_on.client": [os.getpid()]})
    report = paired_mixed(run_both, 2, meter, lambda *_: None, labels)
    assert firsts == ["tracing_off", "tracing_on"]
    assert [round(c["throughput_pct"], 6) for c in report["pairs"]] == [1.0, 1.0]
    assert all(set(r["cpu_ms_per_request"]) == {"client"} for r in report["runs"])
    assert "client" in report["tracing_on_cost"]["cpu_ms_per_request"]
