"""BERT-family sentence encoders (all-MiniLM-L6-v2, bge-small, e5-small...): the model behind
/v1/embeddings (docs/retrieval.md). Bidirectional attention over a padded batch, no KV cache: an
embedding request is one forward pass, so the paged cache and the scheduler of the decoders do not
apply. Projections go through ``build_linear`` like every decoder's, so the kernel path is the same."""

from __future__ import annotations

from collections.abc import MutableMapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from .options import BuildOptions, build_linear
from .spec import UnsupportedArchitecture

ENCODER_ARCHITECTURES = ("BertModel",)
_ACTIVATIONS = {"gelu": "none", "gelu_new": "tanh", "gelu_pytorch_tanh": "tanh"}


@dataclass(frozen=True)
class EncoderSpec:
    hidden: int
    heads: int
    layers: int
    intermediate: int
    eps: float
    max_positions: int
    type_vocab: int
    gelu_approximate: str  # F.gelu's `approximate`: "none" (erf) | "tanh"

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


def is_encoder(cfg: dict[str, Any]) -> bool:
    return cfg.get("model_type") == "bert" or any(a in ENCODER_ARCHITECTURES for a in cfg.get("architectures") or [])


def encoder_spec(cfg: dict[str, Any]) -> EncoderSpec:
    """The encoder's shape from config.json; anything this module would compute differently from the
    reference implementation is refused here, before any weight is read."""
    problems = []
    if cfg.get("position_embedding_type", "absolute") != "absolute":
        problems.append(f"position_embedding_type {cfg.get('position_embedding_type')!r} (only 'absolute')")
    act = cfg.get("hidden_act", "gelu")
    if act not in _ACTIVATIONS:
        problems.append(f"hidden_act {act!r} (supported: {', '.join(_ACTIVATIONS)})")
    if cfg.get("is_decoder") or cfg.get("add_cross_attention"):
        problems.append("a decoder or cross-attention configuration")
    try:
        spec = EncoderSpec(hidden=int(cfg["hidden_size"]), heads=int(cfg["num_attention_heads"]),
                           layers=int(cfg["num_hidden_layers"]), intermediate=int(cfg["intermediate_size"]),
                           eps=float(cfg.get("layer_norm_eps", 1e-12)),
                           max_positions=int(cfg.get("max_position_embeddings", 512)),
                           type_vocab=int(cfg.get("type_vocab_size", 2)),
                           gelu_approximate=_ACTIVATIONS.get(act, "none"))
    except (KeyError, TypeError, ValueError) as exc:
        raise UnsupportedArchitecture(f"encoder config.json lacks or mistypes {exc}") from None
    if spec.hidden <= 0 or spec.heads <= 0 or spec.hidden % spec.heads:
        problems.append(f"hidden_size {spec.hidden} is not a multiple of num_attention_heads {spec.heads}")
    if problems:
        raise UnsupportedArchitecture("the engine cannot run this encoder: " + "; ".join(problems))
    return spec


class _Weights:
    """Pops the checkpoint's tensors by name (with or without the "bert." prefix of *ForX heads)."""

    def __init__(self, tensors: MutableMapping[str, torch.Tensor], dtype: torch.dtype) -> None:
        self.tensors, self.dtype = tensors, dtype
        self.prefix = "bert." if "bert.embeddings.word_embeddings.weight" in tensors else ""

    def take(self, name: str) -> torch.Tensor:
        try:
            return self.tensors.pop(self.prefix + name).to(self.dtype)
        except KeyError:
            raise UnsupportedArchitecture(f"encoder checkpoint lacks tensor {self.prefix + name}") from None


class EncoderLayer(torch.nn.Module):
    def __init__(self, spec: EncoderSpec, w: _Weights, i: int, opt: BuildOptions) -> None:
        super().__init__()
        p = f"encoder.layer.{i}."
        att = p + "attention.self."
        # One fused QKV projection: one GEMM instead of three over the same activations.
        self.qkv = build_linear(opt, torch.cat([w.take(att + n + ".weight") for n in ("query", "key", "value")]),
                                torch.cat([w.take(att + n + ".bias") for n in ("query", "key", "value")]))
        self.out = build_linear(opt, w.take(p + "attention.output.dense.weight"),
                                w.take(p + "attention.output.dense.bias"))
        self.norm1 = (w.take(p + "attention.output.LayerNorm.weight"), w.take(p + "attention.output.LayerNorm.bias"))
        self.up = build_linear(opt, w.take(p + "intermediate.dense.weight"), w.take(p + "intermediate.dense.bias"))
        self.down = build_linear(opt, w.take(p + "output.dense.weight"), w.take(p + "output.dense.bias"))
        self.norm2 = (w.take(p + "output.LayerNorm.weight"), w.take(p + "output.LayerNorm.bias"))
        self.spec = spec

    def forward(self, x: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
        """``x``: [batch * tokens, hidden] (the linears take rows); ``key_mask``: [batch, 1, 1, tokens]."""
        s = self.spec
        b, t = key_mask.shape[0], key_mask.shape[-1]
        q, k, v = self.qkv(x).view(b, t, 3, s.heads, s.head_dim).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=key_mask)
        a = self.out(a.transpose(1, 2).reshape(b * t, s.hidden))
        x = F.layer_norm(a + x, (s.hidden,), *self.norm1, eps=s.eps)
        h = self.down(F.gelu(self.up(x), approximate=s.gelu_approximate))
        return F.layer_norm(h + x, (s.hidden,), *self.norm2, eps=s.eps)


class BertEncoder(torch.nn.Module):
    """Token ids [batch, tokens] and their attention mask -> last hidden states [batch, tokens, hidden]."""

    def __init__(self, cfg: dict[str, Any], tensors: MutableMapping[str, torch.Tensor], opt: BuildOptions) -> None:
        super().__init__()
        self.spec = spec = encoder_spec(cfg)
        w = _Weights(tensors, opt.dtype)
        self.word = w.take("embeddings.word_embeddings.weight")
        self.position = w.take("embeddings.position_embeddings.weight")
        self.token_type = w.take("embeddings.token_type_embeddings.weight")
        self.norm = (w.take("embeddings.LayerNorm.weight"), w.take("embeddings.LayerNorm.bias"))
        self.layers = torch.nn.ModuleList(EncoderLayer(spec, w, i, opt) for i in range(spec.layers))
        # Not used by sentence embeddings (mean / CLS pooling of the last hidden states); dropped.
        for rest in ("embeddings.position_ids", "pooler.dense.weight", "pooler.dense.bias"):
            tensors.pop(w.prefix + rest, None)
        if tensors:
            raise UnsupportedArchitecture(f"encoder checkpoint has tensors this engine would ignore: "
                                          f"{', '.join(sorted(tensors)[:5])}")

    @torch.inference_mode()
    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        s = self.spec
        b, t = ids.shape
        x = self.word[ids] + self.position[:t].unsqueeze(0) + self.token_type[0]
        x = F.layer_norm(x, (s.hidden,), *self.norm, eps=s.eps).reshape(b * t, s.hidden)
        key_mask = mask.bool()[:, None, None, :]  # [batch, 1, 1, keys]: padding is never attended
        for layer in self.layers:
            x = layer(x, key_mask)
        return x.view(b, t, s.hidden)
