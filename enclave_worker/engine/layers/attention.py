"""Paged attention: write K/V into the block pool by slot, attend through block tables with SDPA."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class PrefillChunk:
    token_start: int  # offset in the flat batch
    num_tokens: int
    slots: torch.Tensor  # [context_len] cache slots of positions 0..context_len-1
    mask: torch.Tensor | None  # [num_tokens, context_len] bool, None when plain causal


@dataclass(frozen=True)
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [tokens] cache slot of each new token
    decode_index: torch.Tensor | None  # [decodes] positions in the flat batch of single-token decodes
    decode_blocks: torch.Tensor | None  # [decodes, max_blocks] block tables (padded with block 0)
    decode_mask: torch.Tensor | None  # [decodes, 1, 1, max_blocks * block_size] bool; None for one decode
    prefills: tuple[PrefillChunk, ...]
    all_decode: bool = False  # every token is a single-token decode, in batch order
    single_decode_len: int = 0  # context length when exactly one sequence decodes (no mask then)
    # Fused decode (kernels/): block tables [B, max_blocks] int32, context_lens [B] int32, split count.
    fused: bool = False
    context_lens: torch.Tensor | None = None
    num_splits: int = 1
    block_size: int = 0


class PagedAttention(torch.nn.Module):
    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.scale = head_dim**-0.5
        self.k_cache: torch.Tensor | None = None  # [slots, kv_heads, head_dim], bound by the runner
        self.v_cache: torch.Tensor | None = None
        self.num_blocks = 0

    def _gather_blocks(self, blocks: torch.Tensor, length: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """Whole blocks (contiguous rows of block_size slots) -> [B, Hkv, blocks * block_size, D].

        With ``length`` (one sequence), only its first ``length`` slots: no padding, so no mask.
        """
        b, nb = blocks.shape
        kc, vc = self.k_cache, self.v_cache
        slots_per_block = kc.shape[0] // self.num_blocks
        shape = (b, nb * slots_per_block, self.num_kv_heads, self.head_dim)
        flat = blocks.reshape(-1)
        kd = kc.view(self.num_blocks, -1).index_select(0, flat).view(shape).transpose(1, 2)
        vd = vc.view(self.num_blocks, -1).index_select(0, flat).view(shape).transpose(1, 2)
        if length:
            return kd[:, :, :length], vd[:, :, :length]
        return kd, vd

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        """q: [T, H, D]; k, v: [T, Hkv, D] -> [T, H*D]."""
        kc, vc = self.k_cache, self.v_cache
        kc.index_copy_(0, meta.slot_mapping, k)
        vc.index_copy_(0, meta.slot_mapping, v)
        if meta.all_decode:  # pure decode step: no scatter/gather of queries
            kd, vd = self._gather_blocks(meta.decode_blocks, meta.single_decode_len)
            o = F.scaled_dot_product_attention(
                q.unsqueeze(2), kd, vd, attn_mask=meta.decode_mask, scale=self.scale, enable_gqa=True
            )
            return o.reshape(q.shape[0], -1)
        out = torch.empty_like(q)
        if meta.decode_index is not None:
            qd = q[meta.decode_index].unsqueeze(2)  # [B, H, 1, D]
            kd, vd = self._gather_blocks(meta.decode_blocks, meta.single_decode_len)  # [B, Hkv, L, D]
            o = F.scaled_dot_product_attention(
                qd, kd, vd, attn_mask=meta.decode_mask, scale=self.scale, enable_gqa=True
            )
            out[meta.decode_index] = o.squeeze(2)
        for p in meta.prefills:
            qp = q[p.token_start : p.token_start + p.num_tokens].transpose(0, 1).unsqueeze(0)
            if p.mask is None:  # no cached prefix: attend to this chunk's own K/V, no gather
                kp = k[p.token_start : p.token_start + p.num_tokens].transpose(0, 1).unsqueeze(0)
                vp = v[p.token_start : p.token_start + p.num_tokens].transpose(0, 1).unsqueeze(0)
            else:
                kp = kc[p.slots].transpose(0, 1).unsqueeze(0)
                vp = vc[p.slots].transpose(0, 1).unsqueeze(0)
            o = F.scaled_dot_product_attention(
                qp, kp, vp, attn_mask=p.mask, is_causal=p.mask is None, scale=self.scale, enable_gqa=True
            )
            out[p.token_start : p.token_start + p.num_tokens] = o.squeeze(0).transpose(0, 1)
        return out.reshape(q.shape[0], -1)
