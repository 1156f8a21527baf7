"""`sealed bench serve --tracing-sample R`: serving throughput with OpenTelemetry tracing on at
sampling ratio R against tracing off, in alternating pairs (issue #37: within 3% at 10%).

Tracing is a per-process setting read at start (docs/tracing.md), so the benchmark starts two
`sealed up` stacks of its own, the same in all but the environment: one with no OTEL_* variable
(tracing off: no OpenTelemetry module is even imported), one with
``OTEL_EXPORTER_OTLP_ENDPOINT`` pointing at a local OTLP/HTTP sink (sealed_bench/otlp_sink.py),
``OTEL_TRACES_SAMPLER=parentbased_traceidratio`` and ``OTEL_TRACES_SAMPLER_ARG=R``. Every span of a
sampled request is made, batched, protobuf-encoded and posted by the SDK's real OTLP exporter; the
sink counts them. Both stacks are up for the whole run; only one is loaded at a time, and the pairs
alternate which goes first. The report carries the load average around each run, each stack's
gateway and worker CPU time per request, and what the sink received (spans, sampled requests).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from api.home import Home
from api.stack import DEMO_TENANT
from sealed_bench.serve_load import FreshPrompts, load_tokenizer, print_summary, run_load, summarize
from sealed_bench.serve_pairs import CpuMeter, Labels, Run, RunBoth, paired, paired_mixed, print_costs, stack_pids
from sealed_bench.serve_sealed import _free_port, _machine

LABELS: Labels = ("tracing_off", "tracing_on")
UP_TIMEOUT_S = 1200.0  # encrypting the demo model and loading it, on a loaded 2-core machine


def _clean_env() -> dict[str, str]:
    """This environment without any OTEL_* variable (the baseline must not trace at all)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}


def tracing_env(sink_port: int, ratio: float) -> dict[str, str]:
    return {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{sink_port}",
            "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
            "OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": str(ratio)}


class UpStack:
    """One `sealed up` in its own home, on its own port, with the given environment."""

    def __init__(self, home: Path, env: dict[str, str], label: str) -> None:
        self.home, self.label, self.port = Home(home), label, _free_port()
        home.mkdir(parents=True, exist_ok=True)
        self.log = home / "up.log"
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen([sys.executable, "-m", "api.cli.main", "up", "--home", str(home),
                                          "--port", str(self.port)], env=env, stdout=out,
                                         stderr=subprocess.STDOUT, start_new_session=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def wait_up(self) -> None:
        deadline = time.monotonic() + UP_TIMEOUT_S
        while "Sealed is up" not in self.log.read_text(errors="replace"):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                tail = self.log.read_text(errors="replace")[-3000:]
                raise RuntimeError(f"{self.label}: `sealed up` did not come up:\n{tail}")
            time.sleep(1.0)

    @property
    def api_key(self) -> str:
        return self.home.api_key_file(DEMO_TENANT).read_text().strip()

    def worker_rss_mb(self) -> list[float]:
        """Each worker's resident memory: the engine's build (e.g. oneDNN-packed fp32 weights, a second
        copy of the model, chosen by a measurement at boot) shows here, and it moves throughput far
        more than tracing does, so a pair of stacks that differ here is not a tracing comparison."""
        import psutil

        return [round(psutil.Process(p).memory_info().rss / 2**20, 1) for p in stack_pids(self.home.root)["worker"]]

    def meter(self) -> CpuMeter:
        return CpuMeter(stack_pids(self.home.root))

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # `sealed up` stops every child; tracing flushes its spans
            try:
                self.proc.wait(120)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


def _run_one(args: argparse.Namespace, stacks: dict[str, UpStack], fresh: FreshPrompts) -> Run:
    def run(label: str, mark: Callable[[], None]) -> dict[str, Any]:
        stack = stacks[label]
        results, duration = asyncio.run(run_load(
            stack.url, args.model, stack.api_key, fresh.next(), args.random_output_len, args.request_rate,
            args.max_concurrency, args.seed, args.ignore_eos, on_start=mark))
        return summarize(results, duration, {}) | {"client": "sealed bench serve"}
    return run


def _joint_meter(stacks: dict[str, UpStack]) -> CpuMeter:
    """Both stacks' processes, named `<label>.gateway`, `<label>.worker`: each mode's own CPU."""
    return CpuMeter({f"{label}.{name}": pids for label, stack in stacks.items()
                     for name, pids in stack_pids(stack.home.root).items()})


def _run_both(args: argparse.Namespace, stacks: dict[str, UpStack], fresh: FreshPrompts) -> RunBoth:
    """--mixed: both stacks loaded at once, half the concurrency each, so a drift in the machine's
    load (other jobs) hits both alike; the order they start in swaps from pair to pair."""
    half = max((args.max_concurrency or args.num_prompts) // 2, 1)

    def run_both(first: str, mark: Callable[[], None]) -> dict[str, dict]:
        marked: list[bool] = []
        prompts = {label: fresh.next() for label in LABELS}

        def mark_once() -> None:
            if not marked:
                marked.append(True)
                mark()

        async def go() -> dict[str, dict]:
            gate = asyncio.Barrier(2)

            async def one(label: str) -> tuple[str, dict]:
                stack = stacks[label]
                results, duration = await run_load(
                    stack.url, args.model, stack.api_key, prompts[label], args.random_output_len, args.request_rate,
                    half, args.seed, args.ignore_eos, on_start=mark_once, gate=gate)
                return label, summarize(results, duration, {}) | {"client": "sealed bench serve"}

            second = LABELS[1] if first == LABELS[0] else LABELS[0]
            return dict(await asyncio.gather(one(first), one(second)))

        return asyncio.run(go())
    return run_both


def run_tracing(args: argparse.Namespace) -> int:
    ratio: float = args.tracing_sample
    if not 0 < ratio <= 1:
        raise SystemExit("--tracing-sample must be in (0, 1]")
    fresh = FreshPrompts(args.num_prompts, args.random_input_len, args.seed, load_tokenizer(args.tokenizer_gguf))
    with tempfile.TemporaryDirectory(prefix="sealed-bench-tracing-") as scratch_dir:
        scratch = Path(scratch_dir)
        sink_port, stats = _free_port(), scratch / "otlp-sink.json"
        sink = subprocess.Popen([sys.executable, "-m", "sealed_bench.otlp_sink", "--port", str(sink_port),
                                 "--stats", str(stats)], env=_clean_env())
        traced_env = _clean_env() | tracing_env(sink_port, ratio)
        stacks: dict[str, UpStack] = {}
        try:
            # One after the other: two stacks booting at once would slow each other's model load.
            for label, home, env in ((LABELS[0], "off", _clean_env()), (LABELS[1], "on", traced_env)):
                stacks[label] = UpStack(scratch / home, env, label)
                stacks[label].wait_up()
            rss = {label: stack.worker_rss_mb() for label, stack in stacks.items()}
            if args.mixed:
                report = paired_mixed(_run_both(args, stacks, fresh), args.pairs, _joint_meter(stacks),
                                      print_summary, LABELS)
            else:
                meters = {label: stack.meter() for label, stack in stacks.items()}
                report = paired(_run_one(args, stacks, fresh), args.pairs, meters.__getitem__, print_summary,
                                LABELS)
            rss_after = {label: stack.worker_rss_mb() for label, stack in stacks.items()}
        finally:
            for stack in stacks.values():
                stack.stop()
            sink.send_signal(signal.SIGTERM)
            sink.wait(60)
        received = json.loads(stats.read_text()) if stats.exists() else {}
    print_costs(report, LABELS)
    print(f"worker RSS (MiB) before the runs {rss}, after {rss_after}: a large difference is a different engine "
          "build (boot-time measurement), not tracing")
    completed = sum(r["completed"] for r in report["runs"] if r["mode"] == LABELS[1])
    print(f"OTLP sink: {received.get('spans', 0)} spans in {received.get('exports', 0)} exports; "
          f"{received.get('requests_sampled', 0)} sampled requests of {completed} served traced (+ warm-ups)")
    conditions = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()
                  if "api_key" not in k and k != "json"}
    report = {"conditions": conditions | {"tracing_env": tracing_env(0, ratio) | {"OTEL_EXPORTER_OTLP_ENDPOINT":
                                                                                  "http://127.0.0.1:<sink>"},
                                          "exporter": "OTLP/HTTP protobuf to a local sink (sealed_bench/otlp_sink.py)"},
              "machine": _machine(), "otlp_sink": received, "requests_traced": completed,
              "worker_rss_mb": {"before": rss, "after": rss_after}, **report}
    if args.json:
        args.json.write_text(json.dumps(report, indent=1, default=str))
    return 0 if all(r["failed"] == 0 for r in report["runs"]) else 1
