"""The GPU script's CPU-checkable parts (tests/gpu/big_model.py --dry-run): every section but serve, at the
tiny shape on the CPU, so the script a lent GPU runs first is known to run up to its device."""

from __future__ import annotations

import json
from pathlib import Path

from tests.gpu.big_model import LLAMA_3_1_8B, main, model_config


def test_the_dry_run_makes_checks_encrypts_decrypts_and_answers(tmp_path: Path) -> None:
    assert main(["--dry-run", "--out", str(tmp_path), "--assets", str(tmp_path / "none")]) == 0
    report = json.loads((tmp_path / "big_model.json").read_text())
    assert report["hf_greedy"]["pass"] and report["hf_greedy"]["equal"] == 4
    cold = report["coldstart"]
    assert cold["plaintext_gb"] > 0 and cold["num_kv_blocks"] > 0 and "error" not in cold
    assert "serve" not in report  # needs vLLM and a GPU


def test_the_8b_shape_is_llama_3_1_8b_but_for_the_vocabulary() -> None:
    cfg = model_config("llama-3.1-8b")
    assert cfg["vocab_size"] == 49152 and cfg["num_hidden_layers"] == 32 and cfg["num_key_value_heads"] == 8
    h, inter, layers, kv = 4096, 14336, 32, 1024
    params = 2 * cfg["vocab_size"] * h + layers * (2 * h * h + 2 * kv * h + 3 * h * inter + 2 * h) + h
    assert 7.3e9 < params < 7.5e9 and LLAMA_3_1_8B["hidden_size"] == h
