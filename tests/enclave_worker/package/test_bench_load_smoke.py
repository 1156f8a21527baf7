"""The load benchmark runs end to end on a tiny synthetic model (figures are not asserted)."""

from __future__ import annotations

import json
from pathlib import Path

from sealed_bench import bench_load


def test_bench_load_writes_its_figures(tmp_path: Path) -> None:
    out = tmp_path / "load.json"
    assert bench_load.main(["--synthetic-mib", "8", "--segment-mib", "1", "--repeat", "1", "--openssl-seconds", "1",
                        "--tmpdir", str(tmp_path), "--json", str(out)]) == 0
    figures = json.loads(out.read_text())
    for key in ("decrypt_bytes_per_s", "encrypted_load_s", "safetensors_load_s", "load_vs_safetensors",
                "machine", "openssl"):
        assert key in figures
    assert [p for p in tmp_path.iterdir() if p.name != "load.json"] == []  # temporary copies deleted
