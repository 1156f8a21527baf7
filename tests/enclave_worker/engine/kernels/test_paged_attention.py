"""The Triton paged decode attention equals the gather-then-attend reference (TRITON_INTERPRET=1)."""

from __future__ import annotations

import pytest
import torch

from enclave_worker.engine.kernels import triton_enabled
from enclave_worker.engine.kernels.paged_attention import (
    num_splits_for,
    paged_decode_attention,
    paged_decode_attention_ref,
)


def _case(lens: list[int], heads: int, kv_heads: int, dim: int, block_size: int, dtype: torch.dtype, seed: int,
          device: str = "cpu"):
    g = torch.Generator().manual_seed(seed)
    max_blocks = max(-(-n // block_size) for n in lens) + 1
    num_blocks = len(lens) * max_blocks + 3
    k = torch.randn(num_blocks * block_size, kv_heads, dim, generator=g).to(dtype)
    v = torch.randn(num_blocks * block_size, kv_heads, dim, generator=g).to(dtype)
    perm = torch.randperm(num_blocks, generator=g)  # blocks scattered through the pool, not in order
    tables = perm[: len(lens) * max_blocks].view(len(lens), max_blocks).to(torch.int32)
    q = torch.randn(len(lens), heads, dim, generator=g).to(dtype)
    ctx = torch.tensor(lens, dtype=torch.int32)
    return tuple(t.to(device) for t in (q, k, v, tables, ctx))


@pytest.mark.parametrize("lens, heads, kv_heads, dim, block_size, splits", [
    ([1], 4, 4, 16, 16, 1),  # one token, no GQA
    ([37], 8, 2, 32, 16, 1),  # GQA 4:1, partial last block
    ([5, 64, 17], 6, 2, 24, 8, 3),  # odd head dim (padded), several sequences, split-K
    ([100, 3], 8, 1, 16, 16, 4),  # MQA, more splits than the short sequence needs
])
def test_matches_reference_fp32(lens: list[int], heads: int, kv_heads: int, dim: int, block_size: int,
                                splits: int, device: str) -> None:
    q, k, v, tables, ctx = _case(lens, heads, kv_heads, dim, block_size, torch.float32, len(lens), device)
    assert triton_enabled(q)  # the test really runs the kernel
    got = paged_decode_attention(q, k, v, tables, ctx, block_size, dim**-0.5, num_splits=splits)
    want = paged_decode_attention_ref(q, k, v, tables, ctx, block_size, dim**-0.5)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_bf16_cache_within_bf16_tolerance(device: str) -> None:
    q, k, v, tables, ctx = _case([33, 9], 4, 2, 16, 16, torch.bfloat16, 7, device)
    got = paged_decode_attention(q, k, v, tables, ctx, 16, 0.25, num_splits=2)
    want = paged_decode_attention_ref(q, k, v, tables, ctx, 16, 0.25)
    torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2)


def test_reads_only_the_sequences_blocks(device: str) -> None:
    # Poison every slot outside the sequence's context: the result must not change.
    q, k, v, tables, ctx = _case([20], 4, 2, 16, 8, torch.float32, 3, device)
    used = torch.cat([tables[0, i].long() * 8 + torch.arange(8, device=device) for i in range(3)])[:20]
    k2, v2 = torch.full_like(k, 1e4), torch.full_like(v, 1e4)
    k2[used], v2[used] = k[used], v[used]
    a = paged_decode_attention(q, k, v, tables, ctx, 8, 0.25, num_splits=2)
    b = paged_decode_attention(q, k2, v2, tables, ctx, 8, 0.25, num_splits=2)
    torch.testing.assert_close(a, b)


def test_split_count_is_fixed_by_max_context() -> None:
    assert num_splits_for(128, 16) == 1
    assert num_splits_for(4096, 16) == 8
    assert num_splits_for(1 << 20, 16) == 16
