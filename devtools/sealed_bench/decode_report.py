"""What `sealed bench engine` records and prints about a Sealed row's decode steps: the measured
full-batch step time beside the step's bound (decode_bound.py) at the rates the driver measured
(machine_rates.py), their ratio, and with `--profile-decode` the per-op profile (decode_steps.py)."""

from __future__ import annotations

import dataclasses
import statistics
from typing import Any

from sealed_bench.decode_bound import ModelDims, bound_record, decode_step_cost, step_bound
from sealed_bench.decode_steps import StepClock, op_rows


def held_matmul_bytes(model: Any) -> int:
    """The bytes a decode step's matmuls read as the engine holds them: every dense and int8 layer's and
    the LM head's held tensors (fp32 panels 4 bytes a weight, exact block codes 1.25, layers/coded_panel.py;
    int8 blocks 1.125, layers/q8_blocks.py)."""
    import torch

    helpers: list[Any] = [m.matmul for m in model.modules()  # Linear's, Int8Linear's, PrequantizedInt8Linear's
                          if not isinstance(getattr(m, "matmul", None), type(None) | torch.nn.Module)]
    embed = getattr(model, "embed", None)
    helpers += [getattr(embed, "head", None), getattr(embed, "table", None)]
    held = {id(v): v.nbytes for h in helpers if h is not None for v in vars(h).values() if isinstance(v, torch.Tensor)}
    return sum(held.values())


def decode_figures(clock: StepClock, dims: ModelDims, spec: dict[str, Any],
                   held_weight_bytes: int | None = None) -> dict[str, Any]:
    """`decode_bound` (and `decode_profile` when profiled) for a worker's row; {} without the
    driver's rates (a worker run by hand). The bound is the model's at the row's dtype (fp32: 4 bytes
    a weight); with ``held_weight_bytes`` (the weights as the engine holds them, when fewer) the row
    also carries `held_bound`, the same step's bound over the bytes actually read."""
    bw, gflops = spec.get("copy_gbs"), spec.get("matmul_gflops")
    if not bw or not gflops:
        return {}
    context = clock.mean_context()
    if context is None:  # no full-batch decode step ran (output_len 1): the bound at the prompt's length
        context = float(spec["input_len"])
    cost = decode_step_cost(dims, spec["batch"], context, spec["dtype"])
    bound = step_bound(cost, bw, gflops)
    out: dict[str, Any] = {"decode_bound": {
        **bound_record(cost, bound, clock.median_s()), "steps_timed": len(clock.steps),
        "mean_context": round(context, 1), "copy_gbs": round(bw, 2), "matmul_gflops": round(gflops, 2)}}
    if held_weight_bytes is not None and held_weight_bytes < cost.weight_bytes:
        held = dataclasses.replace(cost, weight_bytes=float(held_weight_bytes))
        out["held_bound"] = bound_record(held, step_bound(held, bw, gflops), clock.median_s())
    if clock.profiled and clock.profile is not None:
        step_s = statistics.median(clock.profiled)
        out["decode_profile"] = {"steps": len(clock.profiled), "step_ms": round(step_s * 1e3, 3),
                                 "ops": op_rows(clock.profile.totals, len(clock.profiled), step_s, bw, gflops)}
    return out


def bound_line(row: dict[str, Any]) -> str:
    b = row["decode_bound"]
    measured = ("no full-batch decode step timed" if b["measured_step_ms"] is None else
                f"measured {b['measured_step_ms']:.1f} ms, {b['ratio_to_bound']:.2f}x the bound")
    line = (f"{row['system']} {row['dtype']} batch {row['batch']} decode step: bound {b['bound_ms']:.1f} ms "
            f"({b['limited_by']}: {b['weight_bytes'] / 1e6:.0f} MB weights + {b['kv_bytes'] / 1e6:.0f} MB KV at "
            f"{b['copy_gbs']:.1f} GB/s = {b['memory_bound_ms']:.1f} ms; {b['gflop']:.2f} GFLOP at "
            f"{b['matmul_gflops']:.1f} GFLOP/s = {b['compute_bound_ms']:.1f} ms); {measured}")
    if "held_bound" in row:
        h = row["held_bound"]
        step = ("no step timed" if h["ratio_to_bound"] is None else f"the step {h['ratio_to_bound']:.2f}x that")
        line += (f"\n  weights as held {h['weight_bytes'] / 1e6:.0f} MB: bound {h['bound_ms']:.1f} ms "
                 f"({h['limited_by']}), {step}")
    for op in row.get("decode_profile", {}).get("ops", []):
        if op["op"] == "other":
            line += f"\n  {'other':<13} {op['ms_per_step']:8.2f} ms"
        else:
            line += (f"\n  {op['op']:<13} {op['ms_per_step']:8.2f} ms {op['mbytes_per_step']:9.1f} MB "
                     f"{op['gflop_per_step']:7.3f} GFLOP {op['gb_per_s']:7.1f} GB/s {op['gflop_per_s']:7.1f} GFLOP/s "
                     f"({op['ratio_to_bound']:.2f}x its bound)")
    return line
