"""Fused decode kernels equal their torch references (TRITON_INTERPRET=1 on the CPU)."""

from __future__ import annotations

import pytest
import torch

from enclave_worker.engine.kernels.fused import (
    add_rms_norm,
    add_rms_norm_ref,
    rope_and_cache,
    rope_and_cache_ref,
    silu_and_mul,
    silu_and_mul_ref,
)
from enclave_worker.engine.layers.rotary import RotaryEmbedding

G = torch.Generator().manual_seed(0)


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("hidden", [64, 100])
def test_add_rms_norm(dtype: torch.dtype, tol: float, hidden: int, device: str) -> None:
    x = torch.randn(5, hidden, generator=G).to(device, dtype)
    res = torch.randn(5, hidden, generator=G).to(device, dtype)
    w = torch.randn(hidden, generator=G).to(device, dtype)
    want_norm, want_sum = add_rms_norm_ref(x, res, w, 1e-5)
    got_norm, got_res = add_rms_norm(x, res.clone(), w, 1e-5)
    torch.testing.assert_close(got_norm.float(), want_norm.float(), rtol=tol, atol=tol)
    torch.testing.assert_close(got_res.float(), want_sum.float(), rtol=tol, atol=tol)


@pytest.mark.parametrize("n", [16, 1536, 3000])
def test_silu_and_mul(n: int, device: str) -> None:
    x = torch.randn(3, 2 * n, generator=G).to(device)
    torch.testing.assert_close(silu_and_mul(x), silu_and_mul_ref(x), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("heads, kv_heads, dim", [(4, 2, 16), (6, 6, 24), (8, 1, 64)])
def test_rope_and_cache_write(heads: int, kv_heads: int, dim: int, device: str) -> None:
    tokens, slots_total = 7, 40
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * dim, generator=G).to(device)
    positions = torch.tensor([0, 1, 2, 9, 10, 31, 5], device=device)
    rope = RotaryEmbedding(dim, 64, 10000.0, device=device)
    cos, sin = rope.half_lookup(positions)
    slots = torch.tensor([3, 4, 5, 17, 18, 39, 0], dtype=torch.int32, device=device)

    def views(t: torch.Tensor):  # q, k, v as strided views of the fused projection, as the model has them
        q = t[:, : heads * dim].view(tokens, heads, dim)
        k = t[:, heads * dim:(heads + kv_heads) * dim].view(tokens, kv_heads, dim)
        v = t[:, (heads + kv_heads) * dim:].view(tokens, kv_heads, dim)
        return q, k, v

    kc_ref = torch.zeros(slots_total, kv_heads, dim, device=device)
    vc_ref = torch.zeros(slots_total, kv_heads, dim, device=device)
    want_q, want_k = rope_and_cache_ref(*views(qkv.clone()), cos, sin, slots, kc_ref, vc_ref)
    kc, vc = torch.zeros_like(kc_ref), torch.zeros_like(vc_ref)
    got_q, got_k = rope_and_cache(*views(qkv.clone()), cos, sin, slots, kc, vc)
    torch.testing.assert_close(got_q, want_q, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got_k, want_k, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(kc, kc_ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(vc, vc_ref)
    # and the reference agrees with the engine's own rotary layer
    q_eng = rope(rope.lookup(positions), views(qkv.clone())[0])
    torch.testing.assert_close(want_q, q_eng, rtol=1e-5, atol=1e-5)
