"""`sealed tune`: measures the engine's CPU options here and writes a tuning file the worker accepts."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from api.cli.main import build
from api.cli.tune import candidate_threads
from enclave_worker.engine.kernel_path import detect_cpu_class
from enclave_worker.engine_tuning import load_tuning


def test_candidates_are_powers_of_two_and_every_cpu() -> None:
    assert candidate_threads(1) == [1]
    assert candidate_threads(6) == [1, 2, 4, 6]
    assert candidate_threads(8) == [1, 2, 4, 8]


def test_sealed_tune_writes_a_file_the_worker_loads(tmp_path: Path) -> None:
    out = tmp_path / "tuning.json"
    run = CliRunner().invoke(build(), ["tune", "-o", str(out), "--threads", "1", "--batch", "1", "--tokens", "2",
                                       "--repeat", "1"])
    assert run.exit_code == 0, run.output
    tuning = load_tuning(out)
    assert tuning.cpu_class == detect_cpu_class() and tuning.num_threads == 1
    assert tuning.decode_kernels in ("auto", "torch")
    assert "panels+cpp" in run.output and "tokens/s" in run.output  # both kernel choices were measured


@pytest.mark.parametrize("threads", ["0", "1,x", "100000", ""])
def test_sealed_tune_refuses_bad_thread_counts(tmp_path: Path, threads: str) -> None:
    run = CliRunner().invoke(build(), ["tune", "-o", str(tmp_path / "t.json"), "--threads", threads])
    assert run.exit_code == 2, run.output
    assert not (tmp_path / "t.json").exists()
