"""`sealed bench vllmload` and `sealed bench vllmserve`, small, in vLLM's own virtualenv (marker vllm:
skipped where vLLM is absent, failing instead under SEALED_REQUIRE_VLLM=1, as CI sets). The figures
are not asserted; that both sides ran and were reported is."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.vllm, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]


def _bench(name: str, args: list[str], vllm_python: str, out: Path) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, "-m", "api.cli.main", "bench", name, *args, "--vllm-python", vllm_python,
                           "--json", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report: dict[str, Any] = json.loads(out.read_text())
    return report


def test_bench_vllmload(vllm_python: str, tmp_path: Path) -> None:
    report = _bench("vllmload", ["--repeats", "1"], vllm_python, tmp_path / "vllmload.json")
    assert {mode: len(runs) for mode, runs in report["runs"].items()} == {"sealed": 1, "plain": 1}
    assert report["median"]["sealed"]["total_s"] > 0 and report["median"]["plain"]["total_s"] > 0


def test_bench_vllmserve(vllm_python: str, tmp_path: Path) -> None:
    # Our engine in the attested stack (the lighter of the two stacks to start) against `vllm serve`.
    report = _bench("vllmserve", ["--engine", "sealed", "--num-prompts", "2", "--input-len", "8", "--output-len", "4",
                                  "--concurrency", "1", "--pairs", "1"], vllm_python, tmp_path / "vllmserve.json")
    assert {name: len(runs) for name, runs in report["runs"].items()} == {"sealed": 1, "plain": 1}
    assert all(run["completed"] == 2 for runs in report["runs"].values() for run in runs)


def test_bench_coldstart_against_vllm_serve(vllm_python: str, tmp_path: Path) -> None:
    # One pair on a one-layer model of a real architecture's family, bf16 as checkpoints come: both sides
    # cold to a first token, and peak RSS of each side's processes (vLLM's API server and the engine
    # core it forks: more than one process).
    from sealed_bench.make_model import model_config, write_checkpoint

    model = write_checkpoint(tmp_path / "model", model_config("test-llama", "bf16", layers=1)).out
    report = _bench("coldstart", ["--compare-vllm", "--model", str(model), "--pairs", "1"], vllm_python,
                    tmp_path / "coldstart.json")
    assert {side: len(runs) for side, runs in report["runs"].items()} == {"sealed": 1, "vllm": 1}
    ours, theirs = report["runs"]["sealed"][0], report["runs"]["vllm"][0]
    assert {"boot", "broker", "attest", "release", "decrypt", "load", "first_token"} <= set(ours["worker_phases_s"])
    assert ours["first_token_s"] >= ours["answered_request_sent_s"] > 0
    assert theirs["first_token_s"] >= theirs["answered_request_sent_s"] > 0
    assert "server_listening" in theirs["milestones_s"] and "load_weights" in theirs["took_s"]
    assert ours["peak_rss_worker"]["processes"] == 1 and theirs["peak_rss"]["processes"] >= 2
    assert ours["weights_held_bytes"] > 0 and ours["kv_pool_bytes"] > 0
    assert report["dtype"] == "float32" and report["ratio_first_token"] > 0
