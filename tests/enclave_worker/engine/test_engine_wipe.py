"""Revocation wipe: every weight the engine holds, copies included, and the KV pool end up zero."""

from __future__ import annotations

import pytest
import torch


@pytest.mark.parametrize("dtype", ["float32", "int8"])
def test_wipe_zeroes_every_weight_copy_and_the_kv_pool(make_engine, dtype: str) -> None:
    eng = make_engine(dtype=dtype, kv_cache_memory_bytes=8 << 20)
    layer = eng.model.layers[0]
    fused = layer.qkv_proj.weight if dtype == "float32" else layer.qkv_proj.qweight  # a copy (fused)
    held = eng.held_tensors()
    assert any(t is fused for t in held)
    assert any(t is eng.runner.kv_cache for t in held)
    # every linear layer of every decoder layer is covered, not only registered parameters
    assert len(held) >= 4 * len(eng.model.layers)
    assert fused.abs().sum() > 0
    eng.wipe()
    assert all(not t.any() for t in eng.held_tensors())
    assert not torch.any(eng.model.embed.weight)


def test_booted_worker_wipe_reaches_the_engine_and_the_decrypted_buffer(make_engine) -> None:
    from enclave_worker.boot import BootedWorker
    from enclave_worker.package import DecryptedModel

    eng = make_engine(kv_cache_memory_bytes=8 << 20)
    buffer = torch.full((4096,), 7, dtype=torch.uint8)
    decrypted = DecryptedModel(None, "signer", {}, {}, buffer)  # type: ignore[arg-type]
    BootedWorker(eng, None, "blake3:00", decrypted).wipe()  # type: ignore[arg-type]
    assert not buffer.any()
    assert all(not t.any() for t in eng.held_tensors())
