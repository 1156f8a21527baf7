"""`sealed bench`: every shipped benchmark is reachable from the CLI and shows its own options."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import sealed_bench

EXPECTED = {"attest", "engine", "gpu", "keyrelease", "linear", "load", "policy", "serve", "vllmload", "vllmserve"}


def test_the_package_lists_every_benchmark() -> None:
    assert set(sealed_bench.available()) >= EXPECTED


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_bench_name_help_shows_that_benchmarks_options(name: str) -> None:
    # Through the real CLI in a subprocess: a module that is not registered in sys.modules (the old
    # loader) crashed `sealed bench serve` on its dataclasses before it parsed anything.
    proc = subprocess.run([sys.executable, "-m", "api.cli.main", "bench", name, "--help"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert f"usage: sealed bench {name}" in proc.stdout
    assert "--json" in proc.stdout


def test_unknown_benchmark_is_a_usage_error_naming_the_choices() -> None:
    proc = subprocess.run([sys.executable, "-m", "api.cli.main", "bench", "nope"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "unknown benchmark 'nope'" in proc.stderr and "serve" in proc.stderr


def test_gpu_benchmark_runs_end_to_end_on_a_tiny_model_on_the_cpu(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # The GPU benchmark's whole flow (random model, our engine per dtype, HF in the same run, greedy
    # equality) on the CPU with a tiny architecture; the figures themselves are not asserted.
    from sealed_bench import bench_gpu

    out = tmp_path / "gpu.json"
    assert bench_gpu.main(["--device", "cpu", "--arch", "tiny", "--batch", "1,2", "--input-len", "8",
                           "--output-len", "4", "--quant", "int4,fp8", "--compare", "hf", "--check-hf",
                           "--json", str(out)]) == 0
    rows = __import__("json").loads(out.read_text())["rows"]
    assert rows[0] == {"check": "greedy_fp32_vs_hf", "prompts": 8, "tokens": 32, "equal": 8}
    systems = {(r.get("system"), r.get("dtype"), r.get("batch")) for r in rows}
    assert {("sealed", "bf16", 1), ("sealed", "bf16", 2), ("sealed", "int4", 1), ("sealed", "fp8", 1),
            ("hf", "bf16", 1), ("hf", "bf16", 2)} <= systems


def test_linear_benchmark_runs_every_kernel_and_checks_them_against_torch(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import json

    from sealed_bench import bench_linear

    out = tmp_path / "linear.json"
    assert bench_linear.main(["--batch", "1,3", "--layers", "1", "--vocab", "128", "--rounds", "2",
                              "--json", str(out)]) == 0
    rows = json.loads(out.read_text())
    assert {(r["kernel"], r["batch"]) for r in rows} == {(k, b) for k in bench_linear.KERNELS for b in (1, 3)}
    assert all(r["max_abs_err_vs_torch"] < 1e-3 for r in rows)


def test_engine_benchmark_samples_when_asked_and_records_how(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """`sealed bench engine --temperature --top-p`: the measured requests are sampled (seeded per
    request), and every row says how; a greedy run says temperature 0."""
    from sealed_bench import bench_engine

    out = tmp_path / "engine.json"
    assert bench_engine.main(["--batch", "2", "--input-len", "8", "--output-len", "4", "--temperature", "0.9",
                              "--top-p", "0.95", "--threads", "1", "--structured", "off,json", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert all("error" not in row for row in rows), rows
    assert [(row["system"], row["temperature"], row["top_p"], row["batch"], row["structured"]) for row in rows] == [
        ("sealed", 0.9, 0.95, 2, "off"), ("sealed", 0.9, 0.95, 2, "json")]  # with and without a JSON schema
    assert all(row["output_tok_per_s"] > 0 for row in rows)
    assert all(row["kernel_path"].startswith("cpu/") for row in rows)  # the engine's kernel path, named
    for bad in (["--temperature", "-1"], ["--top-p", "0"], ["--top-p", "1.5"], ["--structured", "yaml"]):
        with pytest.raises(SystemExit):
            bench_engine.main(bad)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="VmHWM and ru_maxrss's inheritance are Linux's")
def test_engine_benchmark_peak_rss_is_the_workers_own_not_its_launchers() -> None:
    """Linux carries ru_maxrss across fork and exec: a worker launched by a driver holding a large heap
    (the peers' plaintext model directory) reported the driver's peak as its own."""
    held = bytearray(400 << 20)
    for i in range(0, len(held), 4096):
        held[i] = 1  # resident, not just reserved
    code = ("import resource; from sealed_bench.bench_engine import peak_rss_mb; "
            "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, peak_rss_mb())")
    inherited, own = map(float, subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                               check=True).stdout.split())
    del held
    assert inherited > 400  # the launcher's peak, which the old measure reported
    assert own < 200
