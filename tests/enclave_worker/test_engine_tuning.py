"""The engine tuning file (`sealed tune` writes it, `--engine-tuning` reads it): every value checked, and
what it sets measured, so a worker's measurement fixes its thread count and kernels."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from enclave_worker.boot import engine_config
from enclave_worker.cli import parse
from enclave_worker.engine.kernel_path import CPU_CLASSES, detect_cpu_class
from enclave_worker.engine_tuning import FORMAT, EngineTuning, TuningFileInvalid, load_tuning

GOOD = {"format": FORMAT, "cpu_class": "x86-avx2", "num_threads": 4, "decode_kernels": "auto"}


def _write(tmp_path: Path, doc: Any) -> Path:
    path = tmp_path / "tuning.json"
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return path


def test_a_tuning_file_round_trips_and_keeps_its_measurements_for_people(tmp_path: Path) -> None:
    tuning = EngineTuning(cpu_class="x86-avx2", num_threads=4, decode_kernels="torch")
    path = _write(tmp_path, tuning.to_json({"tokens_per_s": [{"num_threads": 4, "rate": 9.5}]}))
    assert load_tuning(path) == tuning
    assert json.loads(path.read_text())["measured"]["tokens_per_s"][0]["rate"] == 9.5


BAD = [
    ("not json", "{", "not JSON"),
    ("a list", [GOOD], "not a sealed-engine-tuning-v1"),
    ("another format", GOOD | {"format": "sealed-engine-tuning-v0"}, "not a sealed-engine-tuning-v1"),
    ("unknown field", GOOD | {"max_num_seqs": 64}, "unknown fields"),
    ("missing field", {k: v for k, v in GOOD.items() if k != "num_threads"}, "missing fields"),
    ("unknown cpu class", GOOD | {"cpu_class": "avx2"}, "cpu_class"),
    ("zero threads", GOOD | {"num_threads": 0}, "num_threads"),
    ("threads as text", GOOD | {"num_threads": "4"}, "num_threads"),
    ("threads as a bool", GOOD | {"num_threads": True}, "num_threads"),
    ("threads as a float", GOOD | {"num_threads": 4.0}, "num_threads"),
    ("absurd threads", GOOD | {"num_threads": 10**6}, "num_threads"),
    ("triton on the CPU", GOOD | {"decode_kernels": "triton"}, "decode_kernels"),
    ("unknown kernels", GOOD | {"decode_kernels": "fast"}, "decode_kernels"),
]


@pytest.mark.parametrize(("doc", "message"), [(d, m) for _, d, m in BAD], ids=[name for name, _, _ in BAD])
def test_a_bad_tuning_file_is_refused_with_a_typed_error(tmp_path: Path, doc: Any, message: str) -> None:
    with pytest.raises(TuningFileInvalid, match=message):
        load_tuning(_write(tmp_path, doc))


BASE = ["--broker-url", "http://b", "--tenant", "t", "--model", "m", "--version", "1", "--grpc-port", "9000",
        "--unsafe-no-tenant-policy"]


def test_the_worker_measures_what_the_tuning_file_sets(tmp_path: Path) -> None:
    here = detect_cpu_class()
    path = _write(tmp_path, GOOD | {"cpu_class": here, "num_threads": 3, "decode_kernels": "torch"})
    settings = parse([*BASE, "--package-dir", str(tmp_path), "--engine-tuning", str(path)])[1]
    assert (settings.num_threads, settings.decode_kernels, settings.cpu_class) == (3, "torch", here)
    engine = settings.measured_config()["engine"]
    assert engine["threads"] == 3 and engine["kernel"] == f"cpu/{here}/float32/torch"
    config = engine_config(settings)
    assert (config.num_threads, config.decode_kernels, config.cpu_class) == (3, "torch", here)
    untuned = parse([*BASE, "--package-dir", str(tmp_path)])[1]
    assert "threads" not in untuned.measured_config()["engine"]  # measurements without a file stay as they were
    assert untuned.measured_config() != settings.measured_config()


def test_the_worker_refuses_a_tuning_file_for_another_cpu_class_or_device(tmp_path: Path) -> None:
    other = next(c for c in CPU_CLASSES if c != detect_cpu_class())
    args = [*BASE, "--package-dir", str(tmp_path)]
    with pytest.raises(SystemExit):
        parse([*args, "--engine-tuning", str(_write(tmp_path, GOOD | {"cpu_class": other}))])
    with pytest.raises(SystemExit):
        parse([*args, "--cpu-class", other, "--engine-tuning",
               str(_write(tmp_path, GOOD | {"cpu_class": detect_cpu_class()}))])
    here = str(_write(tmp_path, GOOD | {"cpu_class": detect_cpu_class()}))
    for off_cpu in (["--device", "cuda"], ["--engine", "vllm"]):
        with pytest.raises(SystemExit):
            parse([*args, *off_cpu, "--engine-tuning", here])
    with pytest.raises(SystemExit):  # unreadable: a usage error, not a traceback
        parse([*args, "--engine-tuning", str(tmp_path / "absent.json")])
