"""`sealed bench engine`'s decode figures from the engine's own timers (sealed_bench/decode_steps.py,
decode_report.py): a real run of the default model (a tiny workload) and the per-op arithmetic."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sealed_bench.decode_bound import ModelDims, decode_step_cost
from sealed_bench.decode_steps import LINEARS, op_rows


@pytest.fixture(scope="module")
def row(tmp_path_factory: pytest.TempPathFactory) -> dict:
    from sealed_bench import bench_engine

    out: Path = tmp_path_factory.mktemp("engine") / "engine.json"
    assert bench_engine.main(["--batch", "3", "--input-len", "8", "--output-len", "12", "--profile-decode", "2",
                              "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert len(rows) == 1 and "error" not in rows[0], rows
    first: dict = rows[0]
    return first


def test_the_row_puts_the_measured_decode_step_beside_its_bound(row: dict) -> None:
    bound = row["decode_bound"]
    assert bound["copy_gbs"] > 0 and bound["matmul_gflops"] > 0
    # 12 output tokens: the first comes from the prefill, at most 11 full-batch decode steps (fewer if
    # the requests' prefills fell in different steps), 2 of them profiled and counted apart
    assert 1 <= bound["steps_timed"] <= 11 - 2
    assert 8 <= bound["mean_context"] <= 8 + 11
    assert bound["measured_step_ms"] > 0
    assert bound["ratio_to_bound"] == pytest.approx(bound["measured_step_ms"] / bound["bound_ms"], rel=1e-2)
    assert bound["bound_ms"] == max(bound["memory_bound_ms"], bound["compute_bound_ms"])


def test_the_row_also_bounds_the_step_by_the_weights_as_the_engine_holds_them(row: dict) -> None:
    """The default model's GGUF is Q4_1 / Q8_0, so every layer is held as exact block codes (1.25 bytes
    a weight against fp32's 4, layers/coded_panel.py): `held_bound` is the same step over those bytes."""
    bound, held = row["decode_bound"], row["held_bound"]
    assert held["weight_bytes"] == row["held_matmul_bytes"]
    assert 0.30 < held["weight_bytes"] / bound["weight_bytes"] < 0.32
    assert (held["kv_bytes"], held["gflop"], held["measured_step_ms"]) == (
        bound["kv_bytes"], bound["gflop"], bound["measured_step_ms"])
    assert held["memory_bound_ms"] < bound["memory_bound_ms"] and held["compute_bound_ms"] == bound["compute_bound_ms"]
    assert held["ratio_to_bound"] >= bound["ratio_to_bound"]


def test_the_profile_accounts_for_every_weight_the_bound_counts(row: dict) -> None:
    profile = row["decode_profile"]
    ops = {op["op"]: op for op in profile["ops"]}
    assert set(ops) == {*LINEARS, "attention", "lm_head", "other"}
    for name in LINEARS:
        assert ops[name]["calls_per_step"] == 30  # once per layer
    assert ops["lm_head"]["calls_per_step"] == 1
    # the projections' and the head's weights are the bound's weight bytes less the norms and
    # embedding rows; activations (3 rows) add a little
    dims = ModelDims(576, 1536, 30, 9, 3, 64, 49152, True)
    weights = dims.matmul_params * 4
    profiled = sum(ops[n]["mbytes_per_step"] for n in (*LINEARS, "lm_head")) * 1e6
    assert weights < profiled < weights * 1.01
    flops = sum(ops[n]["gflop_per_step"] for n in (*LINEARS, "lm_head")) * 1e9
    assert flops == pytest.approx(2 * 3 * dims.matmul_params, rel=1e-3)
    assert sum(op["ms_per_step"] for op in profile["ops"]) == pytest.approx(profile["step_ms"], abs=0.05)


def test_op_rows_give_each_op_its_rates_and_bound_and_the_rest_of_the_step_as_other() -> None:
    totals = {"down_proj": [60, 0.2, 4e8, 8e8], "attention": [60, 0.02, 2e7, 1e6]}
    rows = op_rows(totals, steps=2, step_s=0.2, copy_gbs=10.0, gflops=50.0)
    assert [r["op"] for r in rows] == ["down_proj", "attention", "other"]
    down = rows[0]
    assert down["calls_per_step"] == 30 and down["ms_per_step"] == 100.0 and down["share"] == 0.5
    assert down["gb_per_s"] == 2.0 and down["gflop_per_s"] == 4.0
    assert down["bound_ms"] == 20.0 and down["ratio_to_bound"] == 5.0  # 200 MB at 10 GB/s
    assert rows[-1] == {"op": "other", "ms_per_step": 90.0, "share": 0.45}


def test_the_cost_model_and_the_profile_agree_on_attention_flops() -> None:
    dims = ModelDims(576, 1536, 30, 9, 3, 64, 49152, True)
    with_ctx = decode_step_cost(dims, 1, 99).flops - decode_step_cost(dims, 1, 0).flops
    assert with_ctx == 4 * 9 * 64 * 99 * 30


def test_a_negative_profile_step_count_is_a_usage_error() -> None:
    from sealed_bench import bench_engine

    with pytest.raises(SystemExit) as exc:
        bench_engine.main(["--profile-decode", "-1"])
    assert exc.value.code == 2


def test_a_run_that_timed_no_full_batch_step_says_so_in_both_bounds() -> None:
    """A short run can end before a full-batch decode step is timed: the report line says so (it
    raised a TypeError on the held bound's missing ratio, 2026-12-07)."""
    from sealed_bench.decode_report import bound_line

    bound = {"weight_bytes": 4.9e9, "kv_bytes": 1.4e8, "gflop": 39.8, "memory_bound_ms": 132.8,
             "compute_bound_ms": 191.0, "bound_ms": 191.0, "limited_by": "compute", "measured_step_ms": None,
             "ratio_to_bound": None, "copy_gbs": 38.3, "matmul_gflops": 208.6}
    held = bound | {"weight_bytes": 1.5e9, "memory_bound_ms": 42.7}
    line = bound_line({"system": "sealed", "dtype": "fp32", "batch": 16, "decode_bound": bound, "held_bound": held})
    assert "no full-batch decode step timed" in line and "no step timed" in line.splitlines()[1]
