"""The CPU C++ kernels (kernels/cpu_ops.py) against the torch ops they replace, and their bounds checks."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from enclave_worker.engine import SamplingParams
from enclave_worker.engine.kernels import cpu_ops
from enclave_worker.engine.layers.activation import silu_and_mul
from enclave_worker.engine.layers.norm import RMSNorm
from enclave_worker.engine.layers.rotary import RotaryEmbedding

DTYPES = [torch.float32, torch.bfloat16]


def _pool(dtype: torch.dtype, blocks: int = 24, block: int = 4, kv_heads: int = 2, dim: int = 64):
    g = torch.Generator().manual_seed(3)
    shape = (blocks * block, kv_heads, dim)
    return torch.randn(shape, generator=g).to(dtype), torch.randn(shape, generator=g).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dim", [64, 128, 40])  # the two compiled head sizes and the generic loop
def test_decode_attention_reads_blocks_in_place_like_gathered_sdpa(dtype: torch.dtype, dim: int) -> None:
    block, heads, kv_heads = 4, 6, 2
    kc, vc = _pool(dtype, kv_heads=kv_heads, dim=dim)
    tables = torch.tensor([[5, 2, 9, 0], [7, 0, 0, 0], [11, 3, 20, 23]])
    lens = torch.tensor([13, 1, 16])
    q = torch.randn(3, heads, dim).to(dtype)
    out = cpu_ops.paged_decode_attention(q, kc, vc, tables, lens, block, dim**-0.5)
    for b in range(3):  # reference: the sequence's slots gathered, fp32 SDPA
        slots = (tables[b, :, None] * block + torch.arange(block)).reshape(-1)[: lens[b]]
        k, v = kc[slots].float().transpose(0, 1), vc[slots].float().transpose(0, 1)
        ref = F.scaled_dot_product_attention(q[b].float()[:, None], k, v, scale=dim**-0.5, enable_gqa=True)[:, 0]
        tol = 1e-5 if dtype == torch.float32 else 2e-2
        torch.testing.assert_close(out[b].float(), ref, rtol=tol, atol=tol)


@pytest.mark.parametrize(("tables", "lens"), [
    ([[5, 24]], [8]),     # a block index past the pool
    ([[5, -1]], [8]),     # a negative block index
    ([[5, 2]], [9]),      # longer than the table covers
    ([[5, 2]], [0]),      # empty
])
def test_decode_attention_refuses_what_lies_outside_the_pool(tables: list, lens: list) -> None:
    kc, vc = _pool(torch.float32)
    q = torch.randn(1, 6, 64)
    with pytest.raises(RuntimeError, match="outside the KV pool"):
        cpu_ops.paged_decode_attention(q, kc, vc, torch.tensor(tables), torch.tensor(lens), 4, 0.125)


def test_decode_attention_refuses_wrong_dtypes_and_shapes() -> None:
    kc, vc = _pool(torch.float32)
    q = torch.randn(1, 6, 64)
    tables, lens = torch.tensor([[1, 2]]), torch.tensor([5])
    with pytest.raises(RuntimeError, match="int64"):
        cpu_ops.paged_decode_attention(q, kc, vc, tables.int(), lens, 4, 0.125)
    with pytest.raises(RuntimeError, match="one dtype"):
        cpu_ops.paged_decode_attention(q.bfloat16(), kc, vc, tables, lens, 4, 0.125)
    with pytest.raises(RuntimeError, match="head shapes"):
        cpu_ops.paged_decode_attention(torch.randn(1, 5, 64), kc, vc, tables, lens, 4, 0.125)


@pytest.mark.parametrize("dtype", DTYPES)
def test_add_rms_norm_is_the_residual_add_and_rms_norm_bit_for_bit(dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(0)
    x, residual = torch.randn(33, 576, generator=g).to(dtype), torch.randn(33, 576, generator=g).to(dtype)
    norm = RMSNorm(torch.randn(576, generator=g).to(dtype), 1e-5)
    want_sum = x + residual
    out = cpu_ops.add_rms_norm(x, residual, norm.weight, norm.eps)
    assert torch.equal(residual, want_sum)  # updated in place
    tol = 0 if dtype == torch.bfloat16 else 1e-6  # fp32: F.rms_norm's own summation order
    torch.testing.assert_close(out, norm(want_sum), rtol=tol, atol=tol)
    alone = residual.clone()
    torch.testing.assert_close(cpu_ops.add_rms_norm(None, alone, norm.weight, norm.eps), norm(residual),
                               rtol=tol, atol=tol)
    assert torch.equal(alone, residual)  # no add: untouched


@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_and_mul_matches_torch(dtype: torch.dtype) -> None:
    x = torch.randn(17, 2 * 1536) * 4
    x[0, :1536] = torch.linspace(-120.0, 120.0, 1536)  # gates past exp's fp32 range (the fp32 kernel clamps)
    x = x.to(dtype)
    torch.testing.assert_close(cpu_ops.silu_and_mul(x), silu_and_mul(x), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rope_and_cache_rotates_like_the_layer_and_writes_k_and_v(dtype: torch.dtype) -> None:
    heads, kv_heads, dim, tokens = 6, 2, 64, 9
    rope = RotaryEmbedding(dim, 128, 10000.0)
    positions = torch.tensor([0, 1, 2, 3, 50, 51, 52, 100, 127])
    cos, sin = rope.lookup(positions)
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * dim).to(dtype)
    want_qk = rope((cos, sin), qkv[:, : (heads + kv_heads) * dim].reshape(tokens, -1, dim)).reshape(tokens, -1)
    kc, vc = torch.zeros(40, kv_heads, dim, dtype=dtype), torch.zeros(40, kv_heads, dim, dtype=dtype)
    slots = torch.tensor([3, 4, 5, 6, 20, 21, 22, 38, 39])
    v = qkv[:, (heads + kv_heads) * dim :].clone()
    cpu_ops.rope_and_cache(qkv, cos.reshape(tokens, -1), sin.reshape(tokens, -1), slots, kc, vc, heads, kv_heads)
    tol = {"rtol": 1e-6, "atol": 1e-6} if dtype == torch.float32 else {"rtol": 8e-3, "atol": 1e-5}  # one bf16 ulp
    torch.testing.assert_close(qkv[:, : (heads + kv_heads) * dim], want_qk, **tol)  # (FMA vs addcmul's rounding)
    assert torch.equal(kc[slots].reshape(tokens, -1), qkv[:, heads * dim : (heads + kv_heads) * dim])
    assert torch.equal(vc[slots].reshape(tokens, -1), v)
    untouched = torch.ones(40, dtype=torch.bool)
    untouched[slots] = False
    assert not kc[untouched].any() and not vc[untouched].any()


def test_rope_and_cache_refuses_a_slot_outside_the_pool_and_changes_nothing() -> None:
    rope = RotaryEmbedding(64, 16, 10000.0)
    cos, sin = rope.lookup(torch.tensor([0, 1]))
    qkv = torch.randn(2, 10 * 64)
    before = qkv.clone()
    kc, vc = torch.zeros(8, 2, 64), torch.zeros(8, 2, 64)
    for bad in (8, -1):
        with pytest.raises(RuntimeError, match="outside the KV pool"):
            cpu_ops.rope_and_cache(qkv, cos.reshape(2, -1), sin.reshape(2, -1), torch.tensor([1, bad]), kc, vc, 6, 2)
    assert torch.equal(qkv, before) and not kc.any() and not vc.any()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_engine_on_the_cpu_kernels_matches_the_torch_ops(make_engine, h, dtype: str) -> None:
    """Same model, C++ kernels ("auto") and torch's ops ("torch"): batched greedy tokens equal in fp32;
    in bf16 the teacher-forced perplexity agrees within 1% (rounding points differ inside attention)."""
    from tests.enclave_worker.engine.perplexity import perplexity

    fast = make_engine(dtype=dtype, kv_cache_memory_bytes=16 << 20)
    plain = make_engine(dtype=dtype, decode_kernels="torch", kv_cache_memory_bytes=16 << 20)
    assert fast.model.cpu_kernels and fast.runner.cpu_kernel
    assert not plain.model.cpu_kernels and not plain.runner.cpu_kernel
    if dtype == "float32":
        greedy = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
        requests = [(f"r{i}", plain.tokenizer.encode(p), greedy) for i, p in enumerate(h.prompts[:4])]
        want = {rid: h.tokens_of(o) for rid, o in h.run_sync(plain, requests).items()}
        assert {rid: h.tokens_of(o) for rid, o in h.run_sync(fast, requests).items()} == want
    text = plain.tokenizer.encode(" ".join(h.prompts[:3]))
    p_fast, p_plain = perplexity(fast, text), perplexity(plain, text)
    assert abs(p_fast - p_plain) / p_plain < (1e-4 if dtype == "float32" else 0.01), (p_fast, p_plain)


def test_a_missing_kernel_build_stops_the_engine_and_torch_ops_need_none(make_engine, monkeypatch) -> None:
    import enclave_worker.engine.llm_engine as llm_engine
    from enclave_worker.engine.errors import CpuKernelsUnavailable

    def missing() -> None:
        raise CpuKernelsUnavailable("the CPU kernels are not built")

    monkeypatch.setattr(llm_engine, "load_cpu_ops", missing)
    with pytest.raises(CpuKernelsUnavailable):  # no silent fallback: "auto" on the CPU means the built kernels
        make_engine(kv_cache_memory_bytes=8 << 20)
    eng = make_engine(kv_cache_memory_bytes=8 << 20, decode_kernels="torch")
    assert not eng.model.cpu_kernels and not eng.runner.cpu_kernel
