# mypy: disable-error-code="no-untyped-def, untyped-decorator"
# (Triton JIT kernels: Triton compiles them from source and reads their annotations itself, so their
# parameters stay unannotated; the typed wrappers below are what the worker calls.)
"""Decode attention that reads K/V blocks where they lie in the paged pool (no gather), with GQA.

Split-K: each (sequence, KV head, split) program walks its share of the sequence's blocks through
the block table with an online softmax and writes an unnormalised partial; a second kernel merges
the splits. Long contexts thus use many programs even at batch 1. All query heads that share a KV
head are handled by one program, so every K/V block is read once per KV head.

Layout (as `kv_cache.allocate_kv_cache` makes it, per layer): k_cache, v_cache [slots, kv_heads,
head_dim], slot = block * block_size + offset.
"""

from __future__ import annotations

import functools
import math

import torch

from . import triton_enabled


def paged_decode_attention_ref(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                               block_tables: torch.Tensor, context_lens: torch.Tensor, block_size: int,
                               scale: float) -> torch.Tensor:
    """Reference: gather each sequence's slots and attend in float32. q [B, H, D] -> [B, H, D]."""
    batch, heads = q.shape[:2]
    kv_heads = k_cache.shape[1]
    out = torch.empty_like(q)
    for b in range(batch):
        length = int(context_lens[b])
        pos = torch.arange(length, device=q.device)
        slots = block_tables[b].long()[pos // block_size] * block_size + pos % block_size
        k = k_cache[slots].float().repeat_interleave(heads // kv_heads, dim=1)  # [L, H, D]
        v = v_cache[slots].float().repeat_interleave(heads // kv_heads, dim=1)
        scores = torch.einsum("hd,lhd->hl", q[b].float(), k) * scale
        out[b] = torch.einsum("hl,lhd->hd", scores.softmax(-1), v).to(q.dtype)
    return out


@functools.cache  # one JIT function per kernel, so Triton's in-memory compile cache is kept
def _triton_kernels():  # returns the Triton JIT functions (untyped)
    import triton
    import triton.language as tl

    @triton.jit
    def split_kernel(q_ptr, k_ptr, v_ptr, tables_ptr, lens_ptr, acc_ptr, max_ptr, sum_ptr,
                     scale, max_blocks, tokens_per_split,
                     stride_kslot, stride_khead,
                     HEADS: tl.constexpr, KV_HEADS: tl.constexpr, GROUP: tl.constexpr, GROUP_PAD: tl.constexpr,
                     DIM: tl.constexpr, DIM_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr, SPLITS: tl.constexpr):
        seq, kv_head, split = tl.program_id(0), tl.program_id(1), tl.program_id(2)
        length = tl.load(lens_ptr + seq)
        start = split * tokens_per_split
        end = tl.minimum(start + tokens_per_split, length)
        g = tl.arange(0, GROUP_PAD)
        d = tl.arange(0, DIM_PAD)
        head = kv_head * GROUP + g
        g_ok, d_ok = g < GROUP, d < DIM
        q = tl.load(q_ptr + (seq * HEADS + head)[:, None] * DIM + d[None, :],
                    mask=g_ok[:, None] & d_ok[None, :], other=0.0).to(tl.float32)
        m_i = tl.full((GROUP_PAD,), float("-inf"), tl.float32)
        l_i = tl.zeros((GROUP_PAD,), tl.float32)
        acc = tl.zeros((GROUP_PAD, DIM_PAD), tl.float32)
        n = tl.arange(0, BLOCK_SIZE)
        for token0 in range(start, end, BLOCK_SIZE):
            block = tl.load(tables_ptr + seq * max_blocks + token0 // BLOCK_SIZE).to(tl.int64)
            pos = token0 + n
            n_ok = pos < end
            slot = block * BLOCK_SIZE + n
            kv_off = slot[:, None] * stride_kslot + kv_head * stride_khead + d[None, :]
            kv_mask = n_ok[:, None] & d_ok[None, :]
            k = tl.load(k_ptr + kv_off, mask=kv_mask, other=0.0).to(tl.float32)  # [BLOCK, DIM]
            v = tl.load(v_ptr + kv_off, mask=kv_mask, other=0.0).to(tl.float32)
            s = tl.sum(q[:, None, :] * k[None, :, :], axis=2) * scale  # [GROUP, BLOCK]
            s = tl.where(n_ok[None, :], s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, axis=1))
            alpha = tl.exp(m_i - m_new)
            p = tl.exp(s - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, axis=1)
            acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * v[None, :, :], axis=1)
            m_i = m_new
        part = (seq * HEADS + head) * SPLITS + split
        tl.store(acc_ptr + part[:, None] * DIM + d[None, :], acc, mask=g_ok[:, None] & d_ok[None, :])
        tl.store(max_ptr + part, m_i, mask=g_ok)
        tl.store(sum_ptr + part, l_i, mask=g_ok)

    @triton.jit
    def merge_kernel(acc_ptr, max_ptr, sum_ptr, out_ptr,
                     DIM: tl.constexpr, DIM_PAD: tl.constexpr, SPLITS: tl.constexpr, SPLITS_PAD: tl.constexpr):
        row = tl.program_id(0)  # seq * HEADS + head
        s = tl.arange(0, SPLITS_PAD)
        d = tl.arange(0, DIM_PAD)
        s_ok, d_ok = s < SPLITS, d < DIM
        m = tl.load(max_ptr + row * SPLITS + s, mask=s_ok, other=float("-inf"))
        total = tl.load(sum_ptr + row * SPLITS + s, mask=s_ok, other=0.0)
        m_all = tl.max(m, axis=0)
        w = tl.where(total > 0, tl.exp(m - m_all), 0.0)  # splits past the context end hold nothing
        acc = tl.load(acc_ptr + (row * SPLITS + s)[:, None] * DIM + d[None, :],
                      mask=s_ok[:, None] & d_ok[None, :], other=0.0)
        out = tl.sum(acc * w[:, None], axis=0) / tl.sum(total * w, axis=0)
        tl.store(out_ptr + row * DIM + d, out.to(out_ptr.dtype.element_ty), mask=d_ok)

    return split_kernel, merge_kernel


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def num_splits_for(max_context: int, block_size: int, target_tokens: int = 512, limit: int = 16) -> int:
    """Enough splits that each covers about `target_tokens` (a whole number of blocks); fixed per
    max context so a CUDA graph captured once fits every step."""
    return max(1, min(limit, math.ceil(max_context / max(block_size, target_tokens))))


def paged_decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           block_tables: torch.Tensor, context_lens: torch.Tensor, block_size: int,
                           scale: float, num_splits: int = 1) -> torch.Tensor:
    """q [B, H, D]; block_tables [B, max_blocks] (int32); context_lens [B] (int32) -> [B, H, D]."""
    if not triton_enabled(q):
        return paged_decode_attention_ref(q, k_cache, v_cache, block_tables, context_lens, block_size, scale)
    if block_size & (block_size - 1):
        raise ValueError("the Triton paged attention needs a power-of-two block size")
    split_kernel, merge_kernel = _triton_kernels()
    batch, heads, dim = q.shape
    kv_heads = k_cache.shape[1]
    group = heads // kv_heads
    max_blocks = block_tables.shape[1]
    tokens_per_split = -(-max_blocks // num_splits) * block_size
    acc = torch.empty(batch, heads, num_splits, dim, dtype=torch.float32, device=q.device)
    maxes = torch.empty(batch, heads, num_splits, dtype=torch.float32, device=q.device)
    sums = torch.empty(batch, heads, num_splits, dtype=torch.float32, device=q.device)
    split_kernel[(batch, kv_heads, num_splits)](
        q.contiguous(), k_cache, v_cache, block_tables, context_lens, acc, maxes, sums,
        scale, max_blocks, tokens_per_split, k_cache.stride(0), k_cache.stride(1),
        HEADS=heads, KV_HEADS=kv_heads, GROUP=group, GROUP_PAD=max(_pow2(group), 1),
        DIM=dim, DIM_PAD=_pow2(dim), BLOCK_SIZE=block_size, SPLITS=num_splits)
    out = torch.empty_like(q)
    merge_kernel[(batch * heads,)](acc, maxes, sums, out, DIM=dim, DIM_PAD=_pow2(dim), SPLITS=num_splits,
                                   SPLITS_PAD=_pow2(num_splits))
    return out
