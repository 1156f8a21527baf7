"""`sealed bench`: every shipped benchmark is reachable from the CLI and shows its own options."""

from __future__ import annotations

import subprocess
import sys

import pytest

import sealed_bench

EXPECTED = {"attest", "engine", "keyrelease", "load", "policy", "serve"}


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
