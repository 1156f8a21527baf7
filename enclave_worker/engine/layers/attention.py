"""Paged attention: write K/V into the block pool by slot, attend through block tables with SDPA.

A layer with a sliding window (Mistral, Gemma 2/3's local layers) or soft-capped scores (Gemma 2)
takes a torch path of its own (``_attend_masked``: explicit scores, cap, window mask, softmax in
float32): neither the C++ decode kernel nor SDPA caps scores, and the kernel reads every position.
Every K/V stays in the pool (the window only masks), so the prefix cache is unchanged."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..kernels.cpu_ops import paged_decode_attention


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
    # CPU decode kernel (kernels/cpu_ops.py): each decode's context length [decodes] int64; when set,
    # decodes read K/V in place through decode_blocks (no gather, no mask).
    decode_lens: torch.Tensor | None = None


def masked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor, scale: float,
                     softcap: float | None) -> torch.Tensor:
    """q [B, H, Tq, D]; k, v [B, Hkv, L, D]; allowed [B, 1, Tq, L] bool -> [B, H, Tq, D]; scores (soft-capped:
    ``cap * tanh(s / cap)``, as HF Gemma 2) and softmax in float32."""
    b, h, tq, d = q.shape
    hkv = k.shape[1]
    qg = q.reshape(b, hkv, (h // hkv) * tq, d)  # the query heads sharing a KV head, as rows (GQA)
    scores = torch.matmul(qg.float(), k.float().transpose(-1, -2)).mul_(scale).view(b, hkv, h // hkv, tq, -1)
    if softcap:
        scores = torch.tanh(scores / softcap) * softcap
    scores = scores.masked_fill(~allowed.unsqueeze(2), float("-inf"))
    probs = torch.softmax(scores, dim=-1).view(b, hkv, (h // hkv) * tq, -1)
    return torch.matmul(probs, v.float()).view(b, h, tq, d).to(q.dtype)


class PagedAttention(torch.nn.Module):
    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, scale: float | None = None,
                 window: int | None = None, softcap: float | None = None) -> None:
        """``window``: a query sees its last ``window`` positions (itself included); ``softcap``: scores
        are capped at +-softcap by tanh; ``scale``: the scores' factor (head_dim ** -0.5 unless given)."""
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.scale = scale if scale is not None else head_dim**-0.5
        self.window, self.softcap = window, softcap
        self.masked = window is not None or bool(softcap)
        self.k_cache: torch.Tensor | None = None  # [slots, kv_heads, head_dim], bound by the runner
        self.v_cache: torch.Tensor | None = None
        self.num_blocks = 0

    def caches(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The K and V pools (bound by the runner before any step)."""
        if self.k_cache is None or self.v_cache is None:
            raise RuntimeError("the KV cache is not bound")
        return self.k_cache, self.v_cache

    def _gather_blocks(self, blocks: torch.Tensor, length: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """Whole blocks (contiguous rows of block_size slots) -> [B, Hkv, blocks * block_size, D].

        With ``length`` (one sequence), only its first ``length`` slots: no padding, so no mask.
        """
        b, nb = blocks.shape
        kc, vc = self.caches()
        slots_per_block = kc.shape[0] // self.num_blocks
        shape = (b, nb * slots_per_block, self.num_kv_heads, self.head_dim)
        flat = blocks.reshape(-1)
        kd = kc.view(self.num_blocks, -1).index_select(0, flat).view(shape).transpose(1, 2)
        vd = vc.view(self.num_blocks, -1).index_select(0, flat).view(shape).transpose(1, 2)
        if length:
            return kd[:, :, :length], vd[:, :, :length]
        return kd, vd

    def _decode_step(self, q: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        """This step's single-token decodes, q [B, H, D] -> [B, H, D]: the CPU kernel reading K/V in
        place when the runner chose it, else a gather of the blocks and torch's attention."""
        assert meta.decode_blocks is not None  # a step with decodes has their block tables
        if meta.decode_lens is not None:
            kc, vc = self.caches()
            return paged_decode_attention(q.contiguous(), kc, vc, meta.decode_blocks, meta.decode_lens,
                                          kc.shape[0] // self.num_blocks, self.scale)
        kd, vd = self._gather_blocks(meta.decode_blocks, meta.single_decode_len)  # [B, Hkv, L, D]
        return self._decode(q, kd, vd, meta.decode_mask)

    def _decode(self, q: torch.Tensor, kd: torch.Tensor, vd: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """One query token per sequence: q [B, H, D], kd / vd [B, Hkv, L, D] -> [B, H, D].

        fp32 (and any GPU) takes SDPA. bf16 / fp16 on the CPU take two batched matmuls with the
        softmax in fp32: SDPA's CPU flash kernel tiles for long queries and is several times slower
        for one query per sequence in bf16 (docs/benchmarks-history.md, "Figures moved from engine
        docstrings").
        """
        if q.dtype == torch.float32 or q.device.type != "cpu":
            o = F.scaled_dot_product_attention(q.unsqueeze(2), kd, vd, attn_mask=mask, scale=self.scale,
                                               enable_gqa=True)
            return o.squeeze(2)
        b, h, d = q.shape
        groups = h // self.num_kv_heads  # query heads per KV head (GQA)
        scores = torch.matmul(q.view(b, self.num_kv_heads, groups, d), kd.transpose(-1, -2)).float()
        scores.mul_(self.scale)
        if mask is not None:  # [B, 1, 1, L] bool: True where a position exists
            scores.masked_fill_(~mask, float("-inf"))
        probs = torch.softmax(scores, dim=-1).to(q.dtype)
        return torch.matmul(probs, vd).view(b, h, d)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        """q: [T, H, D]; k, v: [T, Hkv, D] -> [T, H*D]."""
        kc, vc = self.caches()
        slots = meta.slot_mapping if meta.slot_mapping.dtype == torch.long else meta.slot_mapping.long()
        kc.index_copy_(0, slots, k)
        vc.index_copy_(0, slots, v)
        if self.masked or meta.fused:
            return self._attend_masked(q, k, v, meta)
        return self.attend(q, k, v, meta)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        """Attention of this step's tokens, their K/V already in the cache (forward, or the fused CPU
        rotary + cache write). q: [T, H, D]; k, v: [T, Hkv, D] -> [T, H*D]."""
        kc, vc = self.caches()
        if meta.all_decode:  # pure decode step: no scatter/gather of queries
            return self._decode_step(q, meta).reshape(q.shape[0], -1)
        out = torch.empty_like(q)
        if meta.decode_index is not None:
            out[meta.decode_index] = self._decode_step(q[meta.decode_index], meta)
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

    def _decode_allowed(self, meta: AttentionMetadata, length: int) -> torch.Tensor:
        """[B, L] bool: the positions each single-token decode sees, from whichever lengths the runner gave."""
        assert meta.decode_blocks is not None
        pos = torch.arange(length, device=meta.decode_blocks.device)
        if meta.decode_mask is not None:
            seen = meta.decode_mask[:, 0, 0, :length]
            lens = seen.sum(-1)
        else:
            given = meta.decode_lens if meta.decode_lens is not None else meta.context_lens
            lens = (given.to(pos.device).long() if given is not None
                    else torch.full((meta.decode_blocks.shape[0],), meta.single_decode_len, device=pos.device))
            seen = pos[None, :] < lens[:, None]
        if self.window is not None:
            seen = seen & (pos[None, :] >= lens[:, None] - self.window)
        return seen

    def _attend_masked(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                       meta: AttentionMetadata) -> torch.Tensor:
        """``attend`` with explicit masks (window, soft-cap) and no C++ kernel; also any fused (GPU) step."""
        kc, vc = self.caches()
        out = torch.empty_like(q)
        decode_index = (torch.arange(q.shape[0], device=q.device) if meta.all_decode else meta.decode_index)
        if decode_index is not None:
            assert meta.decode_blocks is not None
            kd, vd = self._gather_blocks(meta.decode_blocks)  # [B, Hkv, L, D]
            allowed = self._decode_allowed(meta, kd.shape[2])[:, None, None, :]
            qd = q[decode_index].unsqueeze(2)  # [B, H, 1, D]
            out[decode_index] = masked_attention(qd, kd, vd, allowed, self.scale, self.softcap).squeeze(2)
        for p in meta.prefills:
            rows = slice(p.token_start, p.token_start + p.num_tokens)
            if p.mask is None:  # the chunk's own K/V from position 0
                kp, vp, context = k[rows], v[rows], p.num_tokens
            else:
                kp, vp, context = kc[p.slots], vc[p.slots], p.mask.shape[1]
            q_pos = torch.arange(context - p.num_tokens, context, device=q.device)[:, None]
            k_pos = torch.arange(context, device=q.device)[None, :]
            allowed = k_pos <= q_pos
            if self.window is not None:
                allowed = allowed & (k_pos > q_pos - self.window)
            o = masked_attention(q[rows].transpose(0, 1).unsqueeze(0), kp.transpose(0, 1).unsqueeze(0),
                                 vp.transpose(0, 1).unsqueeze(0), allowed[None, None], self.scale, self.softcap)
            out[rows] = o.squeeze(0).transpose(0, 1)
        return out.reshape(q.shape[0], -1)
