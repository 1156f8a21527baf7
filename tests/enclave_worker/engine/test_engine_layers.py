"""Kernel choices inside the layers agree with the plain reference math."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from enclave_worker.engine.layers.attention import AttentionMetadata, PagedAttention
from enclave_worker.engine.layers.embedding import Embedding
from enclave_worker.engine.layers.linear import DenseMatmul, Linear, LinearOptions, make_linear
from enclave_worker.engine.layers.rotary import RotaryEmbedding

FP32 = LinearOptions()  # fp32 on the CPU, torch's F.linear


@pytest.mark.parametrize("rows", [1, 2, 17])
@pytest.mark.parametrize("bias", [False, True])
def test_linear_matches_reference_for_every_row_count(rows: int, bias: bool) -> None:
    g = torch.Generator().manual_seed(0)
    w, b = torch.randn(96, 64, generator=g), torch.randn(96, generator=g)
    x = torch.randn(rows, 64, generator=g)
    lin = make_linear(w, b if bias else None, FP32)
    assert isinstance(lin, Linear) and isinstance(lin.matmul, DenseMatmul)
    torch.testing.assert_close(lin(x), F.linear(x, w, b if bias else None), rtol=1e-5, atol=1e-5)


def test_an_unknown_dense_kernel_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown dense kernel"):
        make_linear(torch.randn(8, 8), None, LinearOptions(kernel="openblas"))


def test_embedding_looks_up_rows_and_ties_the_head() -> None:
    w = torch.randn(50, 16)
    emb = Embedding(w, FP32, tied=True)
    ids = torch.tensor([3, 0, 49, 3])
    torch.testing.assert_close(emb(ids), w[ids])
    x = torch.randn(1, 16)
    torch.testing.assert_close(emb.as_lm_head(x), x @ w.T, rtol=1e-5, atol=1e-5)


def test_rotary_equals_the_hf_rotate_half_formula() -> None:
    rope = RotaryEmbedding(8, 64, 10000.0)
    pos = torch.tensor([0, 5, 63])
    x = torch.randn(3, 2, 8)
    inv = 1.0 / (10000.0 ** (torch.arange(0, 8, 2).float() / 8))
    freqs = pos[:, None].float() * inv[None, :]
    cos, sin = torch.cat((freqs.cos(),) * 2, -1)[:, None], torch.cat((freqs.sin(),) * 2, -1)[:, None]
    rotate_half = torch.cat((-x[..., 4:], x[..., :4]), -1)
    torch.testing.assert_close(rope(rope.lookup(pos), x), x * cos + rotate_half * sin)


def test_single_sequence_decode_without_mask_equals_masked_attention() -> None:
    torch.manual_seed(0)
    attn = PagedAttention(4, 2, 8)
    block, blocks = 4, 6
    attn.k_cache, attn.v_cache = torch.randn(block * blocks, 2, 8), torch.randn(block * blocks, 2, 8)
    attn.num_blocks = blocks
    table = torch.tensor([[4, 1, 3]])  # 3 blocks; the sequence holds 10 tokens, the new one at slot 3*4+1
    q, k, v = torch.randn(1, 4, 8), torch.randn(1, 2, 8), torch.randn(1, 2, 8)
    slot = torch.tensor([3 * block + 1])
    mask = (torch.arange(12) < 10)[None, None, None, :]
    kc, vc = attn.k_cache.clone(), attn.v_cache.clone()
    masked = attn(q, k, v, AttentionMetadata(slot, torch.tensor([0]), table, mask, (), True, 0))
    attn.k_cache, attn.v_cache = kc, vc
    exact = attn(q, k, v, AttentionMetadata(slot, torch.tensor([0]), table, None, (), True, 10))
    torch.testing.assert_close(exact, masked)


@pytest.mark.parametrize("mixed", [False, True])
def test_bf16_decode_attention_equals_fp32_sdpa(mixed: bool) -> None:
    """bf16 decode on the CPU takes two batched matmuls (not SDPA's flash kernel): the same answer as
    fp32 SDPA within bf16 rounding, for a padded batch of three (GQA 6:2), also inside a mixed step."""
    torch.manual_seed(0)
    block, blocks, lens = 4, 12, [10, 3, 7]
    kc, vc = torch.randn(block * blocks, 2, 8), torch.randn(block * blocks, 2, 8)
    table = torch.tensor([[4, 1, 3], [7, 0, 0], [2, 9, 0]])
    slots = torch.tensor([3 * block + 1, 7 * block + 2, 9 * block + 2])  # each sequence's newest token
    mask = (torch.arange(12)[None, :] < torch.tensor(lens)[:, None])[:, None, None, :]
    q, k, v = torch.randn(3, 6, 8), torch.randn(3, 2, 8), torch.randn(3, 2, 8)
    meta = AttentionMetadata(slots, torch.arange(3), table, mask, (), not mixed, 0)
    out = {}
    for dtype in (torch.float32, torch.bfloat16):
        attn = PagedAttention(6, 2, 8)
        attn.k_cache, attn.v_cache, attn.num_blocks = kc.to(dtype), vc.to(dtype), blocks
        out[dtype] = attn(q.to(dtype), k.to(dtype), v.to(dtype), meta)
    assert out[torch.bfloat16].dtype == torch.bfloat16
    torch.testing.assert_close(out[torch.bfloat16].float(), out[torch.float32], rtol=3e-2, atol=3e-2)


def test_in_place_linear_rearranges_the_weight_in_its_own_memory() -> None:
    w = torch.randn(40, 24)
    reference, x = w.clone(), torch.randn(1, 24)
    lin = Linear(w, None, LinearOptions(in_place=True))
    assert lin.weight.data_ptr() == w.data_ptr()  # no second copy of the weight
    torch.testing.assert_close(lin.weight, reference)
    torch.testing.assert_close(lin(x), x @ reference.T, rtol=1e-5, atol=1e-5)


def test_linear_leaves_a_borrowed_weight_untouched() -> None:
    w = torch.randn(40, 24)
    reference = w.clone()
    Linear(w, None, FP32)
    assert torch.equal(w, reference)
