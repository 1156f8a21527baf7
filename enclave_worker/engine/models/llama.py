"""Llama-family decoder (SmolLM2, Llama 3.x, Mistral, Qwen2/2.5 with QKV bias), fused QKV and gate/up."""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any, cast

import torch

from ..kernels import cpu_ops, fused
from ..kernels.paged_attention import paged_decode_attention
from ..layers.activation import silu_and_mul
from ..layers.attention import AttentionMetadata, PagedAttention
from ..layers.embedding import Embedding
from ..layers.norm import RMSNorm
from ..layers.panel import UnpackScratch
from ..layers.rotary import RotaryEmbedding
from .options import BuildOptions, build_linear, head_quant
from .spec import rope_spec
from .weights import Weights

__all__ = ["BuildOptions", "DecoderLayer", "LlamaForCausalLM"]


_Weights = Weights  # the name the package-layout tests know


class DecoderLayer(torch.nn.Module):
    def __init__(self, cfg: dict[str, Any], w: Weights, prefix: str, opt: BuildOptions) -> None:
        super().__init__()
        self.num_heads = cfg["num_attention_heads"]
        self.num_kv_heads = cfg.get("num_key_value_heads", self.num_heads)
        self.head_dim = cfg.get("head_dim") or cfg["hidden_size"] // self.num_heads
        eps, a, m = cfg["rms_norm_eps"], prefix + "self_attn.", prefix + "mlp."
        # The builder owns the popped checkpoint tensors, so layers may rearrange them in place.

        def lin(wt: torch.Tensor, b: torch.Tensor | None = None) -> torch.nn.Module:
            return build_linear(opt, wt, b)

        self.input_norm = RMSNorm(w.take(prefix + "input_layernorm.weight").to(opt.device, opt.dtype), eps)
        qkv = [a + "q_proj.", a + "k_proj.", a + "v_proj."]
        self.qkv_proj = lin(w.take_cat([p + "weight" for p in qkv]), w.take_cat_opt([p + "bias" for p in qkv]))
        self.o_proj = lin(w.take(a + "o_proj.weight"))
        self.attn = PagedAttention(self.num_heads, self.num_kv_heads, self.head_dim)
        self.post_norm = RMSNorm(w.take(prefix + "post_attention_layernorm.weight").to(opt.device, opt.dtype), eps)
        self.gate_up_proj = lin(w.take_cat([m + "gate_proj.weight", m + "up_proj.weight"]))
        self.down_proj = lin(w.take(m + "down_proj.weight"))
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim

    def forward(
        self,
        x: torch.Tensor,
        rope_table: tuple[torch.Tensor, torch.Tensor],
        rope: RotaryEmbedding,
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        t = x.shape[0]
        qkv = self.qkv_proj(self.input_norm(x))
        qk = rope(rope_table, qkv[:, : self.q_size + self.kv_size].reshape(t, -1, self.head_dim))  # one rope
        q, k = qk.split([self.num_heads, self.num_kv_heads], dim=1)
        v = qkv[:, self.q_size + self.kv_size :].reshape(t, self.num_kv_heads, self.head_dim)
        x = x + self.o_proj(self.attn(q, k, v, meta))
        out: torch.Tensor = x + self.down_proj(silu_and_mul(self.gate_up_proj(self.post_norm(x))))
        return out

    def _split_qkv(self, qkv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Views of the fused QKV output: q [T, H, D], k and v [T, Hkv, D]."""
        t, q_end = qkv.shape[0], self.q_size + self.kv_size
        return (qkv[:, : self.q_size].view(t, self.num_heads, self.head_dim),
                qkv[:, self.q_size : q_end].view(t, self.num_kv_heads, self.head_dim),
                qkv[:, q_end:].view(t, self.num_kv_heads, self.head_dim))

    def forward_cpu(
        self,
        x: torch.Tensor,
        residual: torch.Tensor | None,
        rope_rows: tuple[torch.Tensor, torch.Tensor],
        meta: AttentionMetadata,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``forward`` through the CPU kernels (kernels/cpu_ops.py): the residual stream is carried apart
        and added inside the norms (in place), rotary and the cache write are one call, decode attention
        reads K/V in place. Same math as ``forward`` (tested)."""
        h = cpu_ops.add_rms_norm(None if residual is None else x, x if residual is None else residual,
                                 self.input_norm.weight, self.input_norm.eps)
        residual = x if residual is None else residual
        qkv = self.qkv_proj(h).contiguous()
        attn = self.attn
        k_cache, v_cache = attn.caches()
        cpu_ops.rope_and_cache(qkv, *rope_rows, meta.slot_mapping, k_cache, v_cache, self.num_heads,
                               self.num_kv_heads)
        q, k, v = self._split_qkv(qkv)
        h = cpu_ops.add_rms_norm(self.o_proj(attn.attend(q, k, v, meta)), residual, self.post_norm.weight,
                                 self.post_norm.eps)
        return self.down_proj(cpu_ops.silu_and_mul(self.gate_up_proj(h).contiguous())), residual

    def forward_fused(
        self,
        x: torch.Tensor,
        residual: torch.Tensor | None,
        rope_half: tuple[torch.Tensor, torch.Tensor],
        meta: AttentionMetadata,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """A decode step through the fused kernels (kernels/): the residual stream is carried apart and
        added inside the norms; rope and the cache write are one launch; attention reads blocks in place."""
        t = x.shape[0]
        if residual is None:
            residual, h = x, self.input_norm(x)
        else:
            h, residual = fused.add_rms_norm(x, residual, self.input_norm.weight, self.input_norm.eps)
        q, k, v = self._split_qkv(self.qkv_proj(h))
        attn = self.attn
        k_cache, v_cache = attn.caches()
        assert meta.decode_blocks is not None and meta.context_lens is not None  # a fused step is all decodes
        q, k = fused.rope_and_cache(q, k, v, *rope_half, meta.slot_mapping, k_cache, v_cache)
        o = paged_decode_attention(q, k_cache, v_cache, meta.decode_blocks, meta.context_lens,
                                   meta.block_size, attn.scale, meta.num_splits)
        h, residual = fused.add_rms_norm(self.o_proj(o.reshape(t, -1)), residual, self.post_norm.weight,
                                         self.post_norm.eps)
        return self.down_proj(fused.silu_and_mul(self.gate_up_proj(h))), residual


class LlamaForCausalLM(torch.nn.Module):
    def __init__(self, cfg: dict[str, Any], tensors: MutableMapping[str, torch.Tensor], opt: BuildOptions) -> None:
        super().__init__()
        w = Weights(tensors, opt.release)
        self.cpu_kernels = False  # set by the engine where kernels/cpu_ops.py builds
        # An attribute of the model, so its buffer is one of the held tensors the wipe zeroes.
        self.unpack_scratch = UnpackScratch()
        # The builder owns the popped checkpoint tensors, so layers may rearrange them in place.
        opt = opt.with_scratch(self.unpack_scratch)
        tied = cfg.get("tie_word_embeddings", False) or "lm_head.weight" not in tensors
        # A tied head takes the linears' kernel (a fifth of a decode step's matmul work): in panels the
        # table is held once; packed, a second copy of the table (docs/engine.md, "Kernel paths").
        self.embed = Embedding(w.take("model.embed_tokens.weight"), opt.linear, tied=tied)
        w.release_consumed(self.embed)
        self.layers = torch.nn.ModuleList()
        for i in range(cfg["num_hidden_layers"]):  # each layer's converted sources given back as it is built
            self.layers.append(DecoderLayer(cfg, w, f"model.layers.{i}.", opt))
            w.release_consumed(self.layers[-1])
        # The same layers, typed (a ModuleList's items are plain Modules to the type checker).
        self.decoder_layers: list[DecoderLayer] = cast(list[DecoderLayer], list(self.layers))
        self.norm = RMSNorm(w.take("model.norm.weight").to(opt.device, opt.dtype), cfg["rms_norm_eps"])
        lm_head = w.take_opt("lm_head.weight")
        if cfg.get("tie_word_embeddings", False) or lm_head is None:
            self.lm_head = None
        else:
            self.lm_head = build_linear(opt.with_scratch(None), lm_head, None, head_quant(opt))
        del lm_head
        w.release_consumed(self)
        layer0 = self.decoder_layers[0]
        self.num_kv_heads, self.head_dim = layer0.num_kv_heads, layer0.head_dim
        rope = rope_spec(cfg, layer0.head_dim)  # flat rope_theta / rope_scaling, or rope_parameters
        self.rope = RotaryEmbedding(layer0.head_dim, opt.max_positions, rope.theta, rope.scaling, opt.device)

    def attention_layers(self) -> list[PagedAttention]:
        """Each layer's attention, in order (the runner binds each to its slice of the KV pool)."""
        return [layer.attn for layer in self.decoder_layers]

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        logits_index: torch.Tensor,
    ) -> torch.Tensor:
        """Hidden states for all tokens, logits (float32) only at `logits_index`."""
        x = self.embed(input_ids)
        if meta.fused:
            return self._forward_fused(x, positions, meta, logits_index)
        if self.cpu_kernels:
            return self._forward_cpu(x, positions, meta, logits_index)
        rope_table = self.rope.lookup(positions)  # once per step, not per layer
        for layer in self.layers:
            x = layer(x, rope_table, self.rope, meta)
        x = self.norm(x[logits_index])
        logits = self.embed.as_lm_head(x) if self.lm_head is None else self.lm_head(x)
        return logits.float()

    def _forward_cpu(
        self, x: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata, logits_index: torch.Tensor
    ) -> torch.Tensor:
        cos, sin = self.rope.lookup(positions)  # [T, 1, D] float32, once per step
        rope_rows = (cos.reshape(cos.shape[0], -1), sin.reshape(sin.shape[0], -1))
        residual: torch.Tensor | None = None
        for layer in self.decoder_layers:
            x, residual = layer.forward_cpu(x, residual, rope_rows, meta)
        assert residual is not None
        residual.add_(x)  # the last layer's output joins the stream; only the sampled rows are normed
        x = cpu_ops.add_rms_norm(None, residual[logits_index].contiguous(), self.norm.weight, self.norm.eps)
        logits = self.embed.as_lm_head(x) if self.lm_head is None else self.lm_head(x)
        return logits.float()

    def _forward_fused(
        self, x: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata, logits_index: torch.Tensor
    ) -> torch.Tensor:
        rope_half = self.rope.half_lookup(positions)
        residual: torch.Tensor | None = None
        for layer in self.decoder_layers:
            x, residual = layer.forward_fused(x, residual, rope_half, meta)
        assert residual is not None
        x, _ = fused.add_rms_norm(x, residual, self.norm.weight, self.norm.eps)
        x = x[logits_index]
        logits = self.embed.as_lm_head(x) if self.lm_head is None else self.lm_head(x)
        return logits.float()
