"""`sealed bench llamaserve`, small: a 2-layer made model at Q8_0 served by our stack (int8) and by
llama-server, both under `vllm bench serve`. Skipped with a reason where llama-server is not built
(.llamacpp-venv, docs/benchmarks.md) or vLLM is absent; failing instead under SEALED_REQUIRE_LLAMACPP=1.
The figures are not asserted; that both sides produced tokens and were reported is."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sealed_bench.llama_side import LlamaServerNotFound, find_llama_server

pytestmark = [pytest.mark.vllm, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def llama_server() -> Path:
    try:
        return find_llama_server()
    except LlamaServerNotFound as exc:
        if os.environ.get("SEALED_REQUIRE_LLAMACPP") == "1":
            pytest.fail(f"{exc}; SEALED_REQUIRE_LLAMACPP=1")
        pytest.skip(str(exc))


def _sealed(*args: str, timeout: int = 1800) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([sys.executable, "-m", "api.cli.main", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def test_bench_llamaserve_small(llama_server: Path, vllm_python: str, tmp_path: Path) -> None:
    model = tmp_path / "model"
    _sealed("bench", "make-model", "--shape", "test-llama", "--dtype", "fp32", "--out", str(model), "--gguf", "Q8_0")
    out = tmp_path / "llamaserve.json"
    _sealed("bench", "llamaserve", "--model-dir", str(model), "--quant", "Q8_0", "--num-prompts", "3",
            "--input-len", "8", "--output-len", "4", "--concurrency", "2", "--parallel", "2", "--pairs", "1",
            "--vllm-python", vllm_python, "--json", str(out))
    report = json.loads(out.read_text())
    assert {name: len(runs) for name, runs in report["runs"].items()} == {"sealed": 1, "llama": 1}
    for runs in report["runs"].values():
        assert runs[0]["completed"] == 3 and runs[0]["output_throughput"] > 0
        assert len(runs[0]["loadavg_before"]) == 3
    probe = report["prompt_tokens_probe"]
    assert probe["sealed"] == probe["llama"] > 0
    llama = report["configs"]["llama"]
    assert llama["peer"] == "llama.cpp" and llama["dtype"] == "Q8_0" and llama["parallel"] == 2
    assert report["ratio"] > 0 and set(report["checks"]) == {"throughput_1_0x", "tpot_p50_no_higher",
                                                      "every_request_completed"}
    assert report["machine"]["cpu"]["model_name"] and report["quant"] == "Q8_0"
