"""One decoder layer of any family the spec describes (spec.py): fused QKV (with or without bias, or
Phi-3's single qkv_proj), optional per-head q/k RMSNorm (Qwen3, Gemma 3), partial or scaled rotary,
paged attention with an optional sliding window and soft-capping, Gemma's extra norms around attention
and the MLP, and a gated MLP (SwiGLU / GeGLU) or routed experts (moe.py). Every projection is built
by ``build_linear`` (options.py), so it takes the same quantized and CPU kernels as the Llama layer."""

from __future__ import annotations

import torch

from ..layers.activation import act_and_mul
from ..layers.attention import AttentionMetadata, PagedAttention
from ..layers.norm import RMSNorm
from ..layers.rotary import RotaryEmbedding
from .moe import SparseMoe
from .options import BuildOptions, build_linear
from .spec import DecoderSpec, LayerSpec
from .weights import Weights


def make_norm(spec: DecoderSpec, weight: torch.Tensor, opt: BuildOptions) -> RMSNorm:
    """RMSNorm with the checkpoint's weight; Gemma stores ``w`` for a ``(1 + w)`` scale, applied once here."""
    w = weight.to(opt.device, torch.float32)
    return RMSNorm((w + 1.0 if spec.gemma_norm else w).to(opt.dtype), spec.eps)


class GenericDecoderLayer(torch.nn.Module):
    def __init__(self, spec: DecoderSpec, layer: LayerSpec, w: Weights, prefix: str, opt: BuildOptions) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = spec.heads, spec.kv_heads, spec.head_dim
        self.q_size, self.kv_size = spec.heads * spec.head_dim, spec.kv_heads * spec.head_dim
        a, m = prefix + "self_attn.", prefix + "mlp."

        def norm(name: str) -> RMSNorm:
            return make_norm(spec, w.take(name), opt)

        self.input_norm = norm(prefix + "input_layernorm.weight")
        if spec.fused_qkv:
            self.qkv_proj = build_linear(opt, w.take(a + "qkv_proj.weight"), w.take_opt(a + "qkv_proj.bias"))
        else:
            qkv = [a + "q_proj.", a + "k_proj.", a + "v_proj."]
            self.qkv_proj = build_linear(opt, w.take_cat([p + "weight" for p in qkv]),
                                         w.take_cat_opt([p + "bias" for p in qkv]))
        self.o_proj = build_linear(opt, w.take(a + "o_proj.weight"))
        self.q_norm = norm(a + "q_norm.weight") if spec.qk_norm else None
        self.k_norm = norm(a + "k_norm.weight") if spec.qk_norm else None
        self.attn = PagedAttention(spec.heads, spec.kv_heads, spec.head_dim, spec.attn_scale, layer.window,
                                   spec.attn_softcap)
        # Llama: input / post_attention (before the MLP). Gemma: input, post_attention (after attention),
        # pre_feedforward, post_feedforward.
        self.post_attn_norm = norm(prefix + "post_attention_layernorm.weight") if spec.sandwich_norm else None
        self.pre_mlp_norm = norm(prefix + ("pre_feedforward_layernorm.weight" if spec.sandwich_norm
                                           else "post_attention_layernorm.weight"))
        self.post_mlp_norm = norm(prefix + "post_feedforward_layernorm.weight") if spec.sandwich_norm else None
        self.activation = spec.activation
        self.moe = SparseMoe(spec, w, prefix, opt) if layer.moe else None
        if self.moe is None:
            gate_up = (w.take(m + "gate_up_proj.weight") if w.has(m + "gate_up_proj.weight")
                       else w.take_cat([m + "gate_proj.weight", m + "up_proj.weight"]))
            self.gate_up_proj: torch.nn.Module | None = build_linear(opt, gate_up)
            self.down_proj: torch.nn.Module | None = build_linear(opt, w.take(m + "down_proj.weight"))
        else:
            self.gate_up_proj = self.down_proj = None

    def attention(self, x: torch.Tensor, rope: RotaryEmbedding, table: tuple[torch.Tensor, torch.Tensor],
                  meta: AttentionMetadata) -> torch.Tensor:
        t = x.shape[0]
        qkv = self.qkv_proj(x)
        q = qkv[:, : self.q_size].reshape(t, self.num_heads, self.head_dim)
        k = qkv[:, self.q_size : self.q_size + self.kv_size].reshape(t, self.num_kv_heads, self.head_dim)
        v = qkv[:, self.q_size + self.kv_size :].reshape(t, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        out: torch.Tensor = self.o_proj(self.attn(rope(table, q), rope(table, k), v.contiguous(), meta))
        return out

    def mlp(self, x: torch.Tensor) -> torch.Tensor:
        if self.moe is not None:
            out: torch.Tensor = self.moe(x)
            return out
        assert self.gate_up_proj is not None and self.down_proj is not None
        out = self.down_proj(act_and_mul(self.gate_up_proj(x), self.activation))
        return out

    def forward(self, x: torch.Tensor, rope: RotaryEmbedding, table: tuple[torch.Tensor, torch.Tensor],
                meta: AttentionMetadata) -> torch.Tensor:
        h = self.attention(self.input_norm(x), rope, table, meta)
        x = x + (h if self.post_attn_norm is None else self.post_attn_norm(h))
        h = self.mlp(self.pre_mlp_norm(x))
        return x + (h if self.post_mlp_norm is None else self.post_mlp_norm(h))
