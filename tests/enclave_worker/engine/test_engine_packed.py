"""Prepacked fp32 weights (EngineConfig.packed_weights): same math, same greedy tokens, one copy."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from enclave_worker.engine import SamplingParams
from enclave_worker.engine.layers.linear import Linear
from enclave_worker.engine.layers.packed import PackedMatmul, is_zero, packing_available

pytestmark = pytest.mark.skipif(not packing_available(), reason="torch built without oneDNN")


@pytest.mark.parametrize("rows", [1, 3, 64, 130])
@pytest.mark.parametrize("bias", [False, True])
def test_packed_linear_matches_the_reference_at_every_row_count(rows: int, bias: bool) -> None:
    g = torch.Generator().manual_seed(0)
    w, b = torch.randn(192, 64, generator=g), torch.randn(192, generator=g)
    x = torch.randn(rows, 64, generator=g)
    lin = Linear(w, b if bias else None, torch.float32, "cpu", packed=True)
    assert isinstance(lin.matmul, PackedMatmul) and lin.weight.is_mkldnn
    torch.testing.assert_close(lin(x), F.linear(x, w, b if bias else None), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lin(x[None]), F.linear(x, w, b if bias else None)[None], rtol=1e-5, atol=1e-5)


def test_packing_consumes_an_owned_weight_and_leaves_a_borrowed_one() -> None:
    w = torch.randn(128, 64)
    reference = w.clone()
    Linear(w, None, torch.float32, "cpu", packed=True)
    assert torch.equal(w, reference)  # borrowed: untouched
    x = torch.randn(2, 64)
    lin = Linear(w, None, torch.float32, "cpu", in_place=True, packed=True)
    assert is_zero(w)  # handed over: the packed tensor is now the only copy
    torch.testing.assert_close(lin(x), x @ reference.T, rtol=1e-5, atol=1e-5)


def test_packed_weight_zeroes_completely() -> None:
    lin = Linear(torch.randn(128, 64), None, torch.float32, "cpu", packed=True)
    assert not is_zero(lin.weight)
    with torch.inference_mode():  # as LLMEngine.wipe does
        lin.weight.zero_()
    assert is_zero(lin.weight)
    assert not lin(torch.randn(1, 64)).any()


def test_non_fp32_weights_keep_the_plain_kernels() -> None:
    lin = Linear(torch.randn(32, 16), None, torch.bfloat16, "cpu", packed=True)
    assert not isinstance(lin.matmul, PackedMatmul) and not lin.weight.is_mkldnn


def test_packed_engine_gives_the_plain_engines_greedy_tokens(make_engine, h) -> None:
    plain = make_engine(packed_weights=False, kv_cache_memory_bytes=16 << 20)
    packed = make_engine(packed_weights=True, kv_cache_memory_bytes=16 << 20)
    assert all(isinstance(layer.gate_up_proj.matmul, PackedMatmul) for layer in packed.model.layers)
    assert not any(isinstance(layer.gate_up_proj.matmul, PackedMatmul) for layer in plain.model.layers)
    greedy = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
    requests = [(f"r{i}", plain.tokenizer.encode(p), greedy) for i, p in enumerate(h.prompts[:4])]
    want = {rid: h.tokens_of(o) for rid, o in h.run_sync(plain, requests).items()}
    got = {rid: h.tokens_of(o) for rid, o in h.run_sync(packed, requests).items()}  # batched: 4-row GEMMs
    assert got == want
    alone = h.run_sync(packed, requests[:1])["r0"]  # one row
    assert h.tokens_of(alone) == want["r0"]


def test_packed_engine_builds_from_the_checkpoint_in_place(checkpoint) -> None:
    """The source of a packed weight is zeroed (for a package: its region of the decrypted buffer)."""
    import dataclasses

    from enclave_worker.engine import EngineConfig, LLMEngine

    tensors = {k: v.clone() for k, v in checkpoint.tensors.items()}
    source = tensors["model.layers.0.mlp.down_proj.weight"]
    original = checkpoint.tensors["model.layers.0.mlp.down_proj.weight"]
    eng = LLMEngine.from_checkpoint(
        dataclasses.replace(checkpoint, tensors=tensors),
        EngineConfig(packed_weights=True, num_threads=1, max_num_seqs=4, kv_cache_memory_bytes=8 << 20),
    )
    assert is_zero(source)
    x = torch.randn(2, original.shape[1])
    torch.testing.assert_close(eng.model.layers[0].down_proj(x), F.linear(x, original), rtol=1e-4, atol=1e-4)
