"""`sealed bench encrypt` runs small (a made test-shaped model), through the real CLI, and reports
its figures; the package it wrote opens with its data key (--verify). Figures are not asserted."""

from __future__ import annotations

from pathlib import Path

from tests.sealed_bench.test_bench_commands import run_bench


def test_bench_encrypt_reports_throughput_and_peak_rss(tmp_path: Path) -> None:
    report = run_bench("encrypt", ["--shape", "test-llama", "--layers", "1", "--verify", "--out-dir",
                                   str(tmp_path / "work")], tmp_path)
    assert report["checkpoint"] == "StreamedCheckpoint"  # the streamed path, not a whole load
    assert report["verified_tensors"] == 11  # embed, 9 per layer, final norm (tied head)
    assert report["plaintext_bytes"] > 0 and report["segments"] >= 1
    assert report["peak_rss"] >= report["rss_after_imports"] > 0
    assert report["throughput_gbps"] > 0 and report["cpu_throughput_gbps"] > 0
    assert (tmp_path / "work" / "package" / "payload.bin").is_file()
