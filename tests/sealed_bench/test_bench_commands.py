"""Every `sealed bench` command runs in CI, small: through the real CLI (`python -m api.cli.main bench
NAME ...`, as a developer runs it), each writing its JSON report. The figures are not asserted (no
timed assertions); that each command runs to the end and reports what it measured is.

COVERED names, for each benchmark, the test file that runs it; a benchmark added to sealed_bench
without a smoke run fails `test_every_benchmark_has_a_smoke_run`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import sealed_bench

ROOT = Path(__file__).resolve().parents[2]
HERE = "tests/sealed_bench/test_bench_commands.py"

# Small arguments for the commands this file runs (each well under a minute on two idle cores).
SMALL: dict[str, list[str]] = {
    "attest": ["--iterations", "3"],
    "console": ["--entries", "200", "--tenants", "2", "--repeat", "1"],
    "flood": ["--streams", "4", "--stream-tokens", "2", "--flood-concurrency", "1", "--flood-max-tokens", "2",
              "--quiet-requests", "2", "--quiet-concurrency", "1", "--quiet-tokens", "2", "--warmup-s", "0.5",
              "--unauthorized", "2", "--token-delay", "0.001"],
    "gateway": ["--requests", "20", "--warmup", "2"],
    "keyrelease": ["--iterations", "3", "--warmup", "1", "--concurrency", "3"],
    "policy": ["--decisions", "20", "--events", "200"],
    "retrieval": ["--chunks", "120", "--queries", "20", "--file-chunks", "40"],
    "revocation": ["--rounds", "1", "--workers", "2", "--flood-rps", "5", "--flood-threads", "1", "--settle-s", "0.2"],
    "sealed": ["--iterations", "5"],
    "upload": ["--mib", "8", "--cuts", "2", "--chunk-mib", "1"],
}

# Where every benchmark's smoke run is.
COVERED: dict[str, str] = {
    **dict.fromkeys(SMALL, HERE),
    "coldstart": "tests/sealed_bench/test_bench_coldstart_smoke.py",
    "encrypt": "tests/enclave_worker/package/test_bench_encrypt_smoke.py",
    "engine": "tests/test_sealed_bench.py",
    "gpu": "tests/test_sealed_bench.py",
    "linear": "tests/test_sealed_bench.py",
    "llamaserve": "tests/sealed_bench/test_bench_llamaserve_smoke.py",  # llama-server (.llamacpp-venv) and vLLM's
    "load": "tests/enclave_worker/package/test_bench_load_smoke.py",
    "make_model": "tests/sealed_bench/test_make_model.py",
    "sealed_path": "tests/sealed_bench/test_sealed_path.py",
    "tracing": "tests/sealed_bench/test_otlp_sink.py",
    "serve": "tests/api/test_bench_serve_smoke.py",  # against the end-to-end tests' running stack
    "vllmload": "tests/sealed_bench/test_bench_vllm_smoke.py",  # vLLM's virtualenv (marker vllm)
    "vllmserve": "tests/sealed_bench/test_bench_vllm_smoke.py",
}


def test_every_benchmark_has_a_smoke_run() -> None:
    assert sorted(COVERED) == sealed_bench.available()
    for name, path in COVERED.items():
        text = (ROOT / path).read_text()
        assert f"bench_{name}" in text or f'"{name}"' in text, f"{path} does not run sealed bench {name}"


def run_bench(name: str, args: list[str], tmp_path: Path, timeout: float = 600) -> dict[str, Any]:
    """`sealed bench NAME ARGS --json FILE` in a subprocess from the checkout; the parsed report."""
    out = tmp_path / f"{name}.json"
    proc = subprocess.run([sys.executable, "-m", "api.cli.main", "bench", name, *args, "--json", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report: dict[str, Any] = json.loads(out.read_text())
    return report


def test_attest(tmp_path: Path) -> None:
    report = run_bench("attest", SMALL["attest"], tmp_path)
    assert [row["tee"] for row in report["rows"]] == ["snp", "tdx", "sim"]
    assert all(row["iterations"] == 3 for row in report["rows"])


def test_console(tmp_path: Path) -> None:
    report = run_bench("console", SMALL["console"], tmp_path)
    assert report["intact"] is True
    assert len(report["pages"]) == 9 and set(report["exports (one tenant)"]) == {"jsonl", "csv", "ocsf"}


def test_flood(tmp_path: Path) -> None:
    report = run_bench("flood", SMALL["flood"], tmp_path)
    assert report["targets"]["quiet_all_succeeded"] and report["targets"]["audit_exact"]
    assert report["unauthorized"] == {"401": 2}


def test_keyrelease(tmp_path: Path) -> None:
    """The broker it starts runs on its own simulated TEE (it exited at start when the benchmark gave
    it no platform signing key); every release is received, each with its own receipt."""
    report = run_bench("keyrelease", SMALL["keyrelease"], tmp_path)
    assert report["sequential_ms"]["n"] == 3
    assert report["concurrent"]["succeeded"] == 3 and report["concurrent"]["all_keys_correct"]
    assert report["receipts"]["total"] == report["receipts"]["distinct"] == report["receipts"]["expected"] == 7


def test_gateway(tmp_path: Path) -> None:
    """Every endpoint answered 200 through the composed app (the benchmark stops on any other answer)."""
    report = run_bench("gateway", SMALL["gateway"], tmp_path)
    assert sorted(k for k in report if k != "load_average") == ["models", "search", "store"]
    assert all(report[k]["requests"] == 20 and report[k]["p50_ms"] > 0 for k in ("models", "search", "store"))


def test_policy(tmp_path: Path) -> None:
    report = run_bench("policy", SMALL["policy"], tmp_path)
    assert report["decisions"] and report["audit"]


def test_revocation(tmp_path: Path) -> None:
    report = run_bench("revocation", SMALL["revocation"], tmp_path)
    assert report["not_revoked"] == [] and report["revocation_latency_s"]["n"] == 2


def test_sealed(tmp_path: Path) -> None:
    report = run_bench("sealed", SMALL["sealed"], tmp_path)
    assert report["results"]["open_request_us"] > 0 and report["results"]["verify_receipt_us"] > 0



def test_retrieval(tmp_path: Path) -> None:
    report = run_bench("retrieval", SMALL["retrieval"], tmp_path)
    assert report["corpus"]["chunks"] >= 120 and report["search"]["plain"]["n"] == 20
    assert report["search"]["store_vector_given"]["n"] == 20 and report["corpus"]["files"] >= 2
    assert 0.0 < report["recall_at_10"]["plain"] <= 1.0 and report["ingestion"]["plain"]["chunks_per_s"] > 0
    assert "stack" not in report["ingestion"]  # no --stack-url: the plain side only
    assert report["snapshot_at_full_size"]["bytes"] > report["corpus"]["chunks"] * 384 * 4  # the vectors at least


def test_retrieval_stack_side_needs_an_api_key(monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    """Refused before any work (the stack's side runs in tests/api/test_embeddings_stack.py)."""
    from sealed_bench.bench_retrieval import main

    monkeypatch.delenv("SEALED_API_KEY", raising=False)
    with pytest.raises(SystemExit) as exc:
        main(["--stack-url", "http://127.0.0.1:1"])
    assert exc.value.code == 2 and "--api-key" in capsys.readouterr().err


def test_upload(tmp_path: Path) -> None:
    """The package goes through two cut connections and is stored; the server's memory is sampled."""
    report = run_bench("upload", SMALL["upload"], tmp_path)
    assert report["cuts_survived"] == 2 and len(report["stored"]) == 64
    assert report["server_rss_max_sample"] >= report["server_rss_before"] > 0 and report["samples"] > 0
