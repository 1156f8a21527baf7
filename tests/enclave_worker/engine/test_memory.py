"""Memory sizing (engine/memory.py): what the host leaves the engine, the KV pool from a fraction of it,
and the one-line refusal of a model that cannot fit."""

from __future__ import annotations

from pathlib import Path

import pytest

from enclave_worker.engine import EngineConfig
from enclave_worker.engine import llm_engine as llm_engine_module
from enclave_worker.engine.errors import EngineError
from enclave_worker.engine.memory import (
    MemoryView,
    ModelDoesNotFit,
    activation_reserve,
    check_fits,
    held_bytes,
    host_memory,
    kv_pool_bytes,
)
from enclave_worker.engine.models import model_tensors

GIB = 1 << 30
MIB = 1 << 20


def fake_host(tmp_path: Path, available_kib: int, cgroup_line: str = "0::/w") -> tuple[Path, Path]:
    proc, root = tmp_path / "proc", tmp_path / "cg"
    (proc / "self").mkdir(parents=True)
    (proc / "meminfo").write_text(f"MemTotal: 99999999 kB\nMemAvailable: {available_kib} kB\nSwapTotal: 8 kB\n")
    (proc / "self" / "cgroup").write_text(cgroup_line + "\n")
    return proc, root


def test_host_memory_is_mem_available_without_a_cgroup_limit(tmp_path: Path) -> None:
    proc, root = fake_host(tmp_path, 8 * 1024 * 1024)
    (root / "w").mkdir(parents=True)
    (root / "w" / "memory.max").write_text("max\n")  # unlimited: not a number
    (root / "w" / "memory.current").write_text(f"{GIB}\n")
    assert host_memory(proc, root) == MemoryView(8 * GIB, "MemAvailable")


def test_a_cgroup_v2_limit_below_mem_available_wins_and_reclaimable_file_pages_count_as_free(tmp_path: Path) -> None:
    proc, root = fake_host(tmp_path, 8 * 1024 * 1024)
    (root / "w").mkdir(parents=True)
    (root / "w" / "memory.max").write_text(f"{4 * GIB}\n")
    (root / "w" / "memory.current").write_text(f"{3 * GIB}\n")
    (root / "w" / "memory.stat").write_text(f"anon 1\ninactive_file {GIB}\n")
    assert host_memory(proc, root) == MemoryView(2 * GIB, "cgroup v2 limit")


def test_a_cgroup_v1_limit_is_read_at_the_controller_root_inside_a_container(tmp_path: Path) -> None:
    proc, root = fake_host(tmp_path, 8 * 1024 * 1024, "4:memory:/outside/path\n0::/")
    (root / "memory").mkdir(parents=True)
    (root / "memory" / "memory.limit_in_bytes").write_text(f"{3 * GIB}\n")
    (root / "memory" / "memory.usage_in_bytes").write_text(f"{2 * GIB}\n")
    (root / "memory" / "memory.stat").write_text(f"total_inactive_file {GIB // 2}\n")
    assert host_memory(proc, root) == MemoryView(GIB + GIB // 2, "cgroup v1 limit")


def test_an_unlimited_cgroup_v1_leaves_mem_available(tmp_path: Path) -> None:
    proc, root = fake_host(tmp_path, 1024, "4:memory:/")
    (root / "memory").mkdir(parents=True)
    (root / "memory" / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    (root / "memory" / "memory.usage_in_bytes").write_text("1\n")
    assert host_memory(proc, root) == MemoryView(1024 * 1024, "MemAvailable")


def test_no_meminfo_is_an_engine_error(tmp_path: Path) -> None:
    with pytest.raises(EngineError, match="meminfo"):
        host_memory(tmp_path / "none", tmp_path)
    (tmp_path / "meminfo").write_text("MemTotal: 1 kB\n")
    with pytest.raises(EngineError, match="no MemAvailable"):
        host_memory(tmp_path, tmp_path)


def test_the_kv_pool_is_the_fraction_less_the_weights_and_the_reserve() -> None:
    view = MemoryView(10 * GIB, "MemAvailable")  # 2 GiB of weights already held: 12 GiB in all
    assert kv_pool_bytes(view, 0.5, 2 * GIB, GIB, 4096) == 6 * GIB - 2 * GIB - GIB
    assert kv_pool_bytes(view, 1.0, 2 * GIB, GIB, 4096) == 12 * GIB - 2 * GIB - GIB


@pytest.mark.parametrize(("utilization", "held", "reserve", "block"), [
    (0.25, 2 * GIB, GIB, 4096),  # 3 GiB usable: weights + reserve take it all
    (0.1, 2 * GIB, 0, 4096),  # the fraction is below the weights alone
    (0.5, 0, 6 * GIB, 1),  # the reserve alone
    (0.5, 4 * GIB, 3 * GIB - 100, 101),  # 7 GiB usable, 100 bytes left, one block is 101
])
def test_a_model_that_leaves_no_block_is_refused_with_one_line(utilization: float, held: int, reserve: int,
                                                               block: int) -> None:
    with pytest.raises(ModelDoesNotFit) as refused:
        kv_pool_bytes(MemoryView(10 * GIB, "cgroup v2 limit"), utilization, held, reserve, block)
    line = str(refused.value)
    assert "\n" not in line and line.startswith("model does not fit: weights as held")
    assert "cgroup v2 limit" in line


@pytest.mark.parametrize("utilization", [0, -0.1, 1.01, float("nan")])
def test_a_fraction_outside_zero_to_one_is_refused(utilization: float) -> None:
    with pytest.raises(ValueError):
        kv_pool_bytes(MemoryView(GIB, "x"), utilization, 0, 0, 1)
    with pytest.raises(ValueError, match="cpu_memory_utilization"):
        EngineConfig(cpu_memory_utilization=utilization)


def test_check_fits_counts_what_the_device_already_holds_against_the_fraction() -> None:
    view = MemoryView(6 * GIB, "cuda:0")  # 8 GiB device, 2 GiB in use
    check_fits(int(3.2 * GIB), "m: its weights", view, 0.65, 2 * GIB)  # 0.65 * 8 - 2 = 3.2 GiB
    with pytest.raises(ModelDoesNotFit, match=r"^model does not fit: m: its weights need at least 3.21 GiB"):
        check_fits(int(3.21 * GIB), "m: its weights", view, 0.65, 2 * GIB)


def test_the_engine_sizes_its_kv_pool_from_the_host_fraction(make_engine, checkpoint, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    view = MemoryView(2 * GIB, "MemAvailable")
    monkeypatch.setattr(llm_engine_module, "host_memory", lambda: view)
    engine = make_engine(cpu_memory_utilization=0.4, max_num_batched_tokens=256)
    pool = engine.runner.kv_cache.untyped_storage().data_ptr()  # the attention layers hold views of it now
    weight_bytes = held_bytes([t for t in model_tensors(engine.model)
                               if t.is_mkldnn or t.untyped_storage().data_ptr() != pool])
    assert weight_bytes >= sum(t.nbytes for t in checkpoint.tensors.values()) // 4  # the weights, not nothing
    reserve = activation_reserve(256, engine.vocab_size, int(checkpoint.config["hidden_size"]))
    block = engine.runner.kv_cache[:, :, :16].nbytes  # one block of K and V, every layer
    expected = (int((2 * GIB + weight_bytes) * 0.4) - weight_bytes - reserve) // block
    assert engine.stats()["num_kv_blocks"] == expected > 0
    assert engine.runner.kv_cache.shape[2] == expected * 16


def test_the_engine_reports_its_weights_as_held_and_its_kv_pool(engine) -> None:  # type: ignore[no-untyped-def]
    # What `sealed bench coldstart --compare-vllm` sets the worker's peak RSS against (issue 49).
    pool = engine.runner.kv_cache.untyped_storage().data_ptr()
    weights = held_bytes([t for t in model_tensors(engine.model)
                          if t.is_mkldnn or t.untyped_storage().data_ptr() != pool])
    stats = engine.stats()
    assert stats["weights_held_bytes"] == weights > 0
    block = engine.runner.kv_cache[:, :, :16].nbytes
    assert stats["kv_pool_bytes"] == stats["num_kv_blocks"] * block == engine.runner.kv_cache.nbytes
    assert 96 * MIB - block < stats["kv_pool_bytes"] <= 96 * MIB  # the session engine's fixed 96 MiB pool


def test_the_engine_refuses_a_model_larger_than_its_host_budget(make_engine, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(llm_engine_module, "host_memory", lambda: MemoryView(64 * MIB, "cgroup v1 limit"))
    with pytest.raises(ModelDoesNotFit, match=r"^model does not fit: weights as held 0\.\d\d GiB .*cgroup v1 limit\)$"):
        make_engine(cpu_memory_utilization=0.9)


def test_a_fixed_pool_smaller_than_one_block_is_refused(make_engine) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ModelDoesNotFit, match="smaller than one KV block"):
        make_engine(kv_cache_memory_bytes=1024)
