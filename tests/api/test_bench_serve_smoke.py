"""`sealed bench serve`, small, against the end-to-end tests' running stack (`sealed up`): the plain
load and the sealed/plaintext pairs (tests/sealed_bench/test_bench_commands.py lists every
benchmark's smoke run). The figures are not asserted; that every request completes is."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from api.stack import DEMO_MODEL
from tests.api.conftest import RunningStack

SMALL = ["--num-prompts", "2", "--random-input-len", "8", "--random-output-len", "4"]


def _serve(stack: RunningStack, args: list[str], out: Path) -> dict:  # type: ignore[type-arg]
    proc = subprocess.run([sys.executable, "-m", "api.cli.main", "bench", "serve", "--url", stack.url, "--model",
                           DEMO_MODEL, "--api-key", stack.api_key, *SMALL, *args, "--json", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(out.read_text())  # type: ignore[no-any-return]


def test_bench_serve_plain(stack: RunningStack, tmp_path: Path) -> None:
    report = _serve(stack, [], tmp_path / "serve.json")
    result = report["results"]["sealed"]  # the default label of the one target
    assert (result["completed"], result["failed"], result["total_output_tokens"]) == (2, 0, 8)


def test_bench_serve_sealed_pairs(stack: RunningStack, tmp_path: Path) -> None:
    report = _serve(stack, ["--sealed", "--policy", str(stack.home / "demo" / "client-policy.json"),
                            "--unsafe-allow-simulated", "--pairs", "1", "--home", str(stack.home)],
                    tmp_path / "sealed.json")
    assert [(run["mode"], run["completed"], run["failed"]) for run in report["runs"]] == [
        ("plaintext", 2, 0), ("sealed", 2, 0)]
    assert set(report["sealed_cost"]["cpu_ms_per_request"]) == {"gateway", "worker", "client"}
