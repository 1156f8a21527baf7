"""`sealed bench serve --sealed`: plaintext and sealed, side by side, in alternating pairs.

Pairs alternate their order (plaintext first, then sealed first, ...) so that a drift in the
machine's load does not always favour one side. Each pair gives a ratio; the report gives each
cost's minimum and median over the pairs, each mode's best and median figures, the load average
around every run, and the CPU time each process of the stack spent per request (gateway, worker,
and the client side: the load generator, plus the `sealed proxy` when there is one). CPU time per
request is what sealed mode adds to a CPU-bound machine, and it moves far less with other jobs'
load than wall-clock figures do.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

Summary = dict[str, Any]


class CpuMeter:
    """CPU seconds (user + system) of named processes, read with psutil before and after a run."""

    def __init__(self, pids: dict[str, list[int]]) -> None:
        import psutil

        self._procs = {name: [psutil.Process(p) for p in ps] for name, ps in pids.items() if ps}

    def snapshot(self) -> dict[str, float]:
        out = {}
        for name, procs in self._procs.items():
            total = 0.0
            for proc in procs:
                times = proc.cpu_times()
                total += times.user + times.system + getattr(times, "children_user", 0.0) + getattr(
                    times, "children_system", 0.0)
            out[name] = total
        return out


def stack_pids(home: Path | None) -> dict[str, list[int]]:
    """The gateway's and workers' pids from a `sealed up` home (run/pids.json), if given."""
    if home is None:
        return {}
    doc = json.loads((home / "run" / "pids.json").read_text())
    return {"gateway": [int(doc["gateway"])], "worker": [int(p) for p in doc.get("workers", [])]}


Run = Callable[[str, Callable[[], None]], Summary]
Labels = tuple[str, str]  # (the baseline, the variant whose cost is measured)
SEALED: Labels = ("plaintext", "sealed")


def _measured(run: Run, label: str, meter: CpuMeter) -> Summary:
    """One run; CPU time counts from `mark()`, which a client calls when its clock starts (after its
    warm-up: connections, and in sealed mode the one-time verification of the deployment)."""
    before, load_before, start = meter.snapshot(), os.getloadavg()[0], time.time()

    def mark() -> None:
        before.update(meter.snapshot())

    summary = run(label, mark)
    after, load_after = meter.snapshot(), os.getloadavg()[0]
    done = max(summary["completed"], 1)
    summary["cpu_ms_per_request"] = {k: round(1000 * (after[k] - before[k]) / done, 2) for k in after}
    summary["loadavg_1m"] = [load_before, load_after]
    summary["started_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(start))
    return summary


def _minmed(values: list[float]) -> dict[str, float]:
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}


def paired(run: Run, pairs: int, meter: CpuMeter | Callable[[str], CpuMeter],
           show: Callable[[str, Summary], None], labels: Labels = SEALED) -> dict[str, Any]:
    """Run `pairs` baseline/variant pairs (plaintext/sealed unless `labels` says otherwise),
    alternating which goes first; the costs per pair and overall. `meter` may depend on the label
    (two deployments: each run counts the CPU of its own processes)."""
    runs: list[tuple[int, str, Summary]] = []
    for i in range(pairs):
        for label in (labels if i % 2 == 0 else labels[::-1]):
            summary = _measured(run, label, meter if isinstance(meter, CpuMeter) else meter(label))
            show(f"pair {i + 1}/{pairs}: {label}", summary)
            runs.append((i, label, summary))
    return _report(runs, pairs, labels)


RunBoth = Callable[[str, Callable[[], None]], dict[str, Summary]]


def paired_mixed(run_both: RunBoth, pairs: int, meter: CpuMeter, show: Callable[[str, Summary], None],
                 labels: Labels = SEALED) -> dict[str, Any]:
    """Each pair runs both modes at the same time (`run_both(first, mark)`: the load of `first` is
    started first), so both see the same machine load (and, on one deployment, the same engine
    batches). CPU time of one deployment is the stack's per request of either mode (it cannot be
    split); where the meter's names carry a label (`tracing_on.worker`: two deployments), each mode
    gets its own."""
    runs: list[tuple[int, str, Summary]] = []
    for i in range(pairs):
        before, load_before, start = meter.snapshot(), os.getloadavg()[0], time.time()

        def mark(b: dict[str, float] = before) -> None:  # the CPU counted from the loads' start
            b.update(meter.snapshot())

        both = run_both(labels[i % 2], mark)
        after, load_after = meter.snapshot(), os.getloadavg()[0]
        done = max(sum(s["completed"] for s in both.values()), 1)
        shared = {k: round(1000 * (after[k] - before[k]) / done, 2) for k in after}
        for label in labels:
            summary = both[label]
            own = {k.split(".", 1)[1]: round(1000 * (after[k] - before[k]) / max(summary["completed"], 1), 2)
                   for k in after if k.startswith(f"{label}.")}
            summary.update(cpu_ms_per_request=own, cpu_ms_per_request_both_modes=shared,
                           loadavg_1m=[load_before, load_after],
                           started_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(start)))
            show(f"pair {i + 1}/{pairs} (both at once): {label}", summary)
            runs.append((i, label, summary))
    return _report(runs, pairs, labels)


def _report(runs: list[tuple[int, str, Summary]], pairs: int, labels: Labels = SEALED) -> dict[str, Any]:
    """Costs of labels[1] against labels[0] (for plaintext/sealed: "sealed_cost")."""
    base, variant = labels
    by_pair: list[dict[str, Summary]] = [{} for _ in range(pairs)]
    for i, label, summary in runs:
        by_pair[i][label] = summary
    costs = []
    for pair in by_pair:
        plain, sealed = pair[base], pair[variant]
        costs.append({
            "throughput_pct": 100 * (1 - sealed["output_throughput"] / plain["output_throughput"])
            if plain["output_throughput"] else float("nan"),
            "ttft_p50_ms": sealed["ttft_ms"]["median"] - plain["ttft_ms"]["median"],
            "tpot_p50_ms": sealed["tpot_ms"]["median"] - plain["tpot_ms"]["median"],
            "cpu_ms_per_request": {k: round(sealed["cpu_ms_per_request"].get(k, 0.0) - v, 2)
                                   for k, v in plain["cpu_ms_per_request"].items()},
        })
    modes: dict[str, Any] = {}
    for label in labels:
        mine = [s for _, lab, s in runs if lab == label]
        modes[label] = {
            "output_throughput": _minmed([s["output_throughput"] for s in mine]),
            "ttft_p50_ms": _minmed([s["ttft_ms"]["median"] for s in mine]),
            "tpot_p50_ms": _minmed([s["tpot_ms"]["median"] for s in mine]),
            "cpu_ms_per_request": {k: statistics.median(s["cpu_ms_per_request"][k] for s in mine)
                                   for k in mine[0]["cpu_ms_per_request"]},
        }
    return {
        "pairs": costs,
        "modes": modes,
        f"{variant}_cost": {
            "throughput_pct": _minmed([c["throughput_pct"] for c in costs]),
            "ttft_p50_ms": _minmed([c["ttft_p50_ms"] for c in costs]),
            "tpot_p50_ms": _minmed([c["tpot_p50_ms"] for c in costs]),
            # best of each mode against best of the other: the least load-disturbed comparison
            "throughput_pct_best": 100 * (1 - modes[variant]["output_throughput"]["max"]
                                          / modes[base]["output_throughput"]["max"]),
            "ttft_p50_ms_best": modes[variant]["ttft_p50_ms"]["min"] - modes[base]["ttft_p50_ms"]["min"],
            "cpu_ms_per_request": {k: round(modes[variant]["cpu_ms_per_request"][k] - v, 2)
                                   for k, v in modes[base]["cpu_ms_per_request"].items()},
        },
        "runs": [{"pair": i + 1, "mode": label, **summary} for i, label, summary in runs],
    }


def print_costs(report: dict[str, Any], labels: Labels = SEALED) -> None:
    cost = report[f"{labels[1]}_cost"]
    print(f"============ Cost of {labels[1]} over {len(report['pairs'])} pairs ({labels[1]} - {labels[0]}) "
          "============")
    for i, c in enumerate(report["pairs"], 1):
        print(f"pair {i}: throughput {c['throughput_pct']:+.2f}%  TTFT p50 {c['ttft_p50_ms']:+.2f} ms  "
              f"TPOT p50 {c['tpot_p50_ms']:+.2f} ms  CPU ms/request {c['cpu_ms_per_request']}")
    t, f = cost["throughput_pct"], cost["ttft_p50_ms"]
    print(f"throughput cost: min {t['min']:+.2f}%  median {t['median']:+.2f}%  (best vs best "
          f"{cost['throughput_pct_best']:+.2f}%)")
    print(f"TTFT p50 cost:   min {f['min']:+.2f} ms  median {f['median']:+.2f} ms  (best vs best "
          f"{cost['ttft_p50_ms_best']:+.2f} ms)")
    print(f"CPU ms per request added (medians): {cost['cpu_ms_per_request']}")
