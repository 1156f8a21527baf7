"""The load benchmark runs end to end on a tiny synthetic model (figures are not asserted)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_load.py"


def test_bench_load_writes_its_figures(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("bench_load_smoke", BENCH)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = tmp_path / "load.json"
    assert module.main(["--synthetic-mib", "8", "--segment-mib", "1", "--repeat", "1", "--openssl-seconds", "1",
                        "--tmpdir", str(tmp_path), "--json", str(out)]) == 0
    figures = json.loads(out.read_text())
    for key in ("decrypt_bytes_per_s", "encrypted_load_s", "safetensors_load_s", "load_vs_safetensors",
                "machine", "openssl"):
        assert key in figures
    assert [p for p in tmp_path.iterdir() if p.name != "load.json"] == []  # temporary copies deleted
