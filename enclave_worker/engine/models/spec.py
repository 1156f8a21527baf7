"""An architecture as the engine needs it, read once from an HF ``config.json`` (the older flat keys
``rope_theta`` / ``rope_scaling`` and transformers 5's ``rope_parameters`` alike): which tensors a
layer holds and which math it does. The decoder (decoder.py) reads only this, never the raw config."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import EngineError


class UnsupportedArchitecture(EngineError):
    """A config the engine cannot serve (an unknown architecture, or a feature of a known one)."""


@dataclass(frozen=True)
class RopeSpec:
    theta: float
    scaling: dict[str, Any] | None  # rope_type "llama3" | "linear" | "longrope" (+ its fields); None: plain
    rotary_dim: int  # the leading part of each head that is rotated (Phi-4-mini: 3/4 of it)


@dataclass(frozen=True)
class LayerSpec:
    window: int | None  # sliding-window attention: a query sees the last `window` positions (itself included)
    rope: RopeSpec
    moe: bool  # routed experts instead of the dense MLP


@dataclass(frozen=True)
class DecoderSpec:
    family: str  # "llama" | "gemma" | "phi3" | "mixtral" | "qwen3_moe" ...
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    eps: float
    layers: tuple[LayerSpec, ...]
    tied: bool
    qkv_bias: bool = False
    qk_norm: bool = False  # Qwen3, Gemma 3: RMSNorm over each head of q and k before rotary
    gemma_norm: bool = False  # (1 + w) RMSNorm weights
    sandwich_norm: bool = False  # Gemma 2/3: norms after attention and MLP too (four a layer)
    embed_scale: float | None = None  # Gemma: embeddings times sqrt(hidden)
    activation: str = "silu"  # "silu" | "gelu_tanh" (GeGLU)
    attn_scale: float | None = None  # None: head_dim ** -0.5
    attn_softcap: float | None = None
    logit_softcap: float | None = None
    fused_qkv: bool = False  # Phi-3: one qkv_proj and one gate_up_proj tensor in the checkpoint
    experts: int = 0
    experts_per_token: int = 0
    expert_intermediate: int = 0
    norm_topk: bool = True  # renormalise the top-k routing weights to sum to 1

    @property
    def plain_llama(self) -> bool:
        """The Llama decoder's math exactly (models/llama.py and its fused CPU/GPU kernels serve it)."""
        return (self.family == "llama" and not self.qk_norm and not self.experts
                and all(lay.window is None and lay.rope == self.layers[0].rope for lay in self.layers)
                and self.layers[0].rope.rotary_dim == self.head_dim
                and (self.layers[0].rope.scaling or {}).get("rope_type") in (None, "default", "llama3"))


def rope_spec(cfg: dict[str, Any], head_dim: int, layer_type: str | None = None) -> RopeSpec:
    """The rotary of one layer type: transformers 5 ``rope_parameters`` (per layer type for Gemma 3), else
    the flat keys (Gemma 3's local layers then take ``rope_local_base_freq``, unscaled)."""
    params = cfg.get("rope_parameters")
    if isinstance(params, dict) and layer_type in params and isinstance(params[layer_type], dict):
        params = params[layer_type]
    partial = float(cfg.get("partial_rotary_factor") or (params or {}).get("partial_rotary_factor") or 1.0)
    rotary_dim = int(head_dim * partial)
    if isinstance(params, dict) and "rope_theta" in params:
        scaling: dict[str, Any] | None = dict(params)
        theta = float(params["rope_theta"])
    else:
        theta = float(cfg.get("rope_theta", 10000.0))
        scaling = dict(cfg["rope_scaling"]) if cfg.get("rope_scaling") else None
        if layer_type == "sliding_attention" and cfg.get("rope_local_base_freq"):
            theta, scaling = float(cfg["rope_local_base_freq"]), None
    if scaling is not None:
        kind = scaling.get("rope_type", scaling.get("type", "default"))
        scaling["rope_type"] = "longrope" if kind == "su" else kind
        if kind not in ("default", "llama3", "linear", "longrope", "su"):
            raise UnsupportedArchitecture(f"rope scaling {kind!r} is not supported by the sealed engine")
        if scaling["rope_type"] == "longrope":
            scaling.setdefault("original_max_position_embeddings", cfg.get("original_max_position_embeddings"))
            scaling["max_position_embeddings"] = cfg.get("max_position_embeddings")
        if scaling["rope_type"] == "default":
            scaling = None
    return RopeSpec(theta, scaling, rotary_dim)


def layer_types(cfg: dict[str, Any], family: str) -> list[str]:
    """"sliding_attention" | "full_attention" per layer, from ``layer_types`` or the older keys."""
    n = int(cfg["num_hidden_layers"])
    if cfg.get("layer_types"):
        types = list(cfg["layer_types"])
        if len(types) != n:
            raise UnsupportedArchitecture("config layer_types does not list every layer")
        return types
    window = cfg.get("sliding_window")
    if not window:
        return ["full_attention"] * n
    model_type = cfg.get("model_type", "")
    if model_type == "gemma2":
        return ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(n)]
    if model_type.startswith("gemma3"):
        pattern = int(cfg.get("sliding_window_pattern") or cfg.get("_sliding_window_pattern") or 6)
        return ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(n)]
    if model_type.startswith("qwen"):  # Qwen windows only when asked, and from max_window_layers on
        if not cfg.get("use_sliding_window"):
            return ["full_attention"] * n
        first = int(cfg.get("max_window_layers", n))
        return ["sliding_attention" if i >= first else "full_attention" for i in range(n)]
    return ["sliding_attention"] * n  # Mistral, Mixtral, Phi-3: every layer


def decoder_spec(cfg: dict[str, Any], family: str) -> DecoderSpec:
    """The spec of a config of ``family`` (the registry in models/__init__.py picks the family)."""
    hidden, heads = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
    head_dim = int(cfg.get("head_dim") or hidden // heads)
    gemma = family == "gemma"
    experts = int(cfg.get("num_local_experts") or cfg.get("num_experts") or 0) if family in (
        "mixtral", "qwen3_moe") else 0
    sparse_step = int(cfg.get("decoder_sparse_step") or 1)
    dense_only = set(cfg.get("mlp_only_layers") or ())
    layers = []
    for i, kind in enumerate(layer_types(cfg, family)):
        window = cfg.get("sliding_window") if kind == "sliding_attention" else None
        layers.append(LayerSpec(int(window) if window else None, rope_spec(cfg, head_dim, kind if gemma else None),
                                bool(experts) and i not in dense_only and (i + 1) % sparse_step == 0))
    act = cfg.get("hidden_activation") or cfg.get("hidden_act") or "silu"
    if act not in ("silu", "gelu_pytorch_tanh", "gelu_tanh"):
        raise UnsupportedArchitecture(f"activation {act!r} is not supported by the sealed engine")
    query_scalar = cfg.get("query_pre_attn_scalar")
    return DecoderSpec(
        family=family, hidden=hidden, heads=heads, kv_heads=int(cfg.get("num_key_value_heads") or heads),
        head_dim=head_dim, intermediate=int(cfg["intermediate_size"]), vocab=int(cfg["vocab_size"]),
        eps=float(cfg.get("rms_norm_eps", 1e-6)), layers=tuple(layers),
        tied=bool(cfg.get("tie_word_embeddings", gemma)),
        qkv_bias=bool(cfg.get("attention_bias", False)) or cfg.get("model_type") == "qwen2",
        qk_norm=family == "qwen3_moe" or cfg.get("model_type") in ("qwen3", "gemma3_text", "gemma3"),
        gemma_norm=gemma, sandwich_norm=gemma, embed_scale=hidden**0.5 if gemma else None,
        activation="silu" if act == "silu" else "gelu_tanh",
        attn_scale=float(query_scalar) ** -0.5 if gemma and query_scalar else None,
        attn_softcap=cfg.get("attn_logit_softcapping") if gemma else None,
        logit_softcap=cfg.get("final_logit_softcapping") if gemma else None,
        fused_qkv=family == "phi3", experts=experts, experts_per_token=int(cfg.get("num_experts_per_tok") or 0),
        expert_intermediate=int(cfg.get("moe_intermediate_size") or cfg["intermediate_size"]),
        norm_topk=bool(cfg.get("norm_topk_prob", True)) if family == "qwen3_moe" else True,
    )
