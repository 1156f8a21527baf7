"""Revocation wipe: every weight the engine holds, copies and packed layouts included, and the KV pool end up zero."""

from __future__ import annotations

import pytest
import torch

from enclave_worker.engine.layers.packed import bf16_native, is_zero, packing_available


@pytest.mark.parametrize(("dtype", "kernels"),
                         [("float32", "torch"), ("float32", "auto"), ("bfloat16", "auto"), ("int8", "auto")])
def test_wipe_zeroes_every_weight_copy_and_the_kv_pool(make_engine, dtype: str, kernels: str) -> None:
    if dtype == "bfloat16" and not (packing_available() and bf16_native()):
        pytest.skip("oneDNN has no bf16 on this CPU (AVX512BW/VL/DQ or AVX-NE-CONVERT)")
    eng = make_engine(dtype=dtype, decode_kernels=kernels, kv_cache_memory_bytes=8 << 20)
    packed = eng.kernel_path.linear == "onednn-packed"
    layer = eng.model.layers[0]
    fused = layer.qkv_proj.matmul.codes if dtype == "int8" else layer.qkv_proj.weight  # a copy (fused)
    assert fused.is_mkldnn == packed
    held = eng.held_tensors()
    assert any(t is fused for t in held)
    assert any(t is eng.runner.kv_cache for t in held)
    # every linear layer of every decoder layer is covered, not only registered parameters
    assert len(held) >= 4 * len(eng.model.layers)
    if packed:  # the packed layouts are held tensors too: four linears a layer
        assert sum(t.is_mkldnn for t in held) >= 4 * len(eng.model.layers)
    assert not is_zero(fused)
    eng.wipe()
    assert all(is_zero(t) for t in eng.held_tensors())
    assert not torch.any(eng.model.embed.weight)
    if dtype == "int8":  # the int8 layers' block scales and the table's codes and scales too
        assert any(t is layer.qkv_proj.matmul.scales for t in held) and is_zero(layer.qkv_proj.matmul.scales)
        assert any(t is eng.model.embed.table.scales for t in held) and is_zero(eng.model.embed.table.scales)
    if dtype == "bfloat16":  # the tied head's packed copy too
        assert any(t is eng.model.embed.head.packed for t in held) and is_zero(eng.model.embed.head.packed)


def test_booted_worker_wipe_reaches_the_engine_and_the_decrypted_buffer(make_engine) -> None:
    from enclave_worker.boot import BootedWorker
    from enclave_worker.package import DecryptedModel

    eng = make_engine(kv_cache_memory_bytes=8 << 20)
    buffer = torch.full((4096,), 7, dtype=torch.uint8)
    decrypted = DecryptedModel(None, "signer", {}, {}, buffer)  # type: ignore[arg-type]
    BootedWorker(eng, None, "blake3:00", decrypted).wipe()  # type: ignore[arg-type]
    assert not buffer.any()
    assert all(is_zero(t) for t in eng.held_tensors())
