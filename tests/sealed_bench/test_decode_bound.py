"""The decode step's bound (sealed_bench/decode_bound.py) for SmolLM2-135M, its dimensions read from
the shipped model's own config (the GGUF metadata), checked against its tensors and by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from sealed_bench.decode_bound import ModelDims, bound_record, decode_step_cost, step_bound


@pytest.fixture(scope="module")
def smollm2() -> tuple[ModelDims, int]:
    """SmolLM2-135M's dims from its config, and its parameter count from its tensors."""
    import gguf

    from enclave_worker.engine.checkpoint import _gguf_config, default_gguf_path

    reader = gguf.GGUFReader(default_gguf_path())
    config, _ = _gguf_config(reader)
    return ModelDims.from_config(config), sum(int(np.prod(t.shape)) for t in reader.tensors)


def test_smollm2_135m_dims_from_its_config(smollm2: tuple[ModelDims, int]) -> None:
    dims, _ = smollm2
    assert dims == ModelDims(hidden=576, intermediate=1536, layers=30, heads=9, kv_heads=3, head_dim=64,
                             vocab=49152, tied=True)


def test_the_parameter_count_is_the_models_tensors(smollm2: tuple[ModelDims, int]) -> None:
    dims, tensor_elems = smollm2
    assert dims.params == tensor_elems == 134_515_008


def test_a_batch_16_fp32_step_reads_every_weight_once_and_does_2_flops_a_weight_a_row() -> None:
    dims = ModelDims(576, 1536, 30, 9, 3, 64, 49152, True)
    per_layer = 576 * 576 * 2 + 576 * 192 * 2 + 3 * 576 * 1536  # q, o; k, v; gate, up, down
    assert dims.linear_per_layer == per_layer == 3_538_944
    matmul = 30 * per_layer + 49152 * 576  # the tied embedding read again as the LM head
    assert dims.matmul_params == matmul
    cost = decode_step_cost(dims, batch=16, context=191, dtype="fp32")
    # weights: projections, LM head, 61 norms, 16 embedding rows; ~538 MB (issue 38: "~540 MB")
    assert cost.weight_bytes == 4 * (matmul + 61 * 576 + 16 * 576) == 538_096_896
    # K and V, 30 layers x 3 heads x 64, for 191 cached tokens + the new one, 16 rows, fp32
    assert cost.kv_bytes == 16 * 192 * 2 * 30 * 3 * 64 * 4
    attention = 4 * 9 * 64 * 192 * 30 * 16
    assert cost.flops == 2 * 16 * matmul + attention
    assert 4.3e9 < cost.flops - attention < 4.31e9  # issue 38: "~4.3 GFLOP"


def test_the_kv_cache_and_weights_shrink_with_the_dtype() -> None:
    dims = ModelDims(576, 1536, 30, 9, 3, 64, 49152, True)
    fp32, bf16 = decode_step_cost(dims, 16, 100, "fp32"), decode_step_cost(dims, 16, 100, "bf16")
    assert bf16.weight_bytes == fp32.weight_bytes / 2 and bf16.kv_bytes == fp32.kv_bytes / 2
    assert bf16.flops == fp32.flops
    assert decode_step_cost(dims, 16, 100, "int8").weight_bytes == fp32.weight_bytes / 4


def test_the_bound_is_the_slower_of_memory_and_compute_and_the_ratio_is_measured_over_it() -> None:
    dims = ModelDims(576, 1536, 30, 9, 3, 64, 49152, True)
    cost = decode_step_cost(dims, 16, 191, "fp32")
    bound = step_bound(cost, copy_gbs=20.0, gflops=100.0)
    assert math.isclose(bound.memory_s, cost.bytes / 20e9)
    assert math.isclose(bound.compute_s, cost.flops / 100e9)
    assert bound.seconds == bound.compute_s and bound.limited_by == "compute"
    assert step_bound(cost, copy_gbs=5.0, gflops=100.0).limited_by == "memory"
    record = bound_record(cost, bound, measured_s=3 * bound.seconds)
    assert record["ratio_to_bound"] == 3.0 and record["limited_by"] == "compute"
    assert record["bound_ms"] == round(bound.seconds * 1e3, 3)
    assert bound_record(cost, bound, None)["ratio_to_bound"] is None


@pytest.mark.parametrize(("batch", "context", "gbs", "gflops"), [(0, 10, 1, 1), (1, -1, 1, 1), (1, 1, 0, 1),
                                                                 (1, 1, 1, -5)])
def test_nonsense_inputs_are_refused(batch: int, context: float, gbs: float, gflops: float) -> None:
    dims = ModelDims(576, 1536, 30, 9, 3, 64, 49152, True)
    with pytest.raises(ValueError):
        step_bound(decode_step_cost(dims, batch, context), gbs, gflops)


def test_an_untied_head_is_stored_and_read_once_more() -> None:
    tied = ModelDims(576, 1536, 30, 9, 3, 64, 49152, True)
    untied = ModelDims(576, 1536, 30, 9, 3, 64, 49152, False)
    assert untied.params == tied.params + 49152 * 576
    assert untied.matmul_params == tied.matmul_params  # either way each token multiplies by one head
