"""The causal LM over GenericDecoderLayer (decoder.py): every family the spec describes that is not
exactly Llama's math (llama.py keeps that, with its fused CPU and GPU kernels). Same engine contract
as LlamaForCausalLM: ``forward(ids, positions, meta, logits_index)`` -> float32 logits, ``layers`` /
``decoder_layers`` with their ``attn``, ``cpu_kernels``, ``num_kv_heads``, ``head_dim``.

Its steps run torch's ops for norms, rotary and activations; decode attention of a layer without a
window or soft-cap reads K/V in place through the C++ kernel when the engine runs the CPU kernels."""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import cast

import torch

from ..layers.attention import AttentionMetadata, PagedAttention
from ..layers.embedding import Embedding
from ..layers.panel import UnpackScratch
from ..layers.rotary import RotaryEmbedding
from .decoder import GenericDecoderLayer, make_norm
from .options import BuildOptions, build_linear, head_quant
from .spec import DecoderSpec
from .weights import Weights


class DecoderForCausalLM(torch.nn.Module):
    def __init__(self, spec: DecoderSpec, tensors: MutableMapping[str, torch.Tensor], opt: BuildOptions) -> None:
        super().__init__()
        w = Weights(tensors, opt.release)
        self.spec = spec
        self.cpu_kernels = False  # set by the engine; attention uses the C++ decode kernel where it can
        self.unpack_scratch = UnpackScratch()  # an attribute, so the wipe zeroes its buffer
        opt = opt.with_scratch(self.unpack_scratch)
        tied = spec.tied or not w.has("lm_head.weight")
        self.embed = Embedding(w.take("model.embed_tokens.weight"), opt.linear, tied=tied)
        w.release_consumed(self.embed)
        self.layers = torch.nn.ModuleList()
        for i, layer in enumerate(spec.layers):  # each layer's converted sources given back as it is built
            self.layers.append(GenericDecoderLayer(spec, layer, w, f"model.layers.{i}.", opt))
            w.release_consumed(self.layers[-1])
        self.decoder_layers: list[GenericDecoderLayer] = cast(list[GenericDecoderLayer], list(self.layers))
        self.norm = make_norm(spec, w.take("model.norm.weight"), opt)
        lm_head = w.take_opt("lm_head.weight")
        self.lm_head = None if tied or lm_head is None else build_linear(
            opt.with_scratch(None), lm_head, None, head_quant(opt))
        del lm_head
        w.release_consumed(self)
        self.num_kv_heads, self.head_dim = spec.kv_heads, spec.head_dim
        # One table per distinct rotary (Gemma 3: local and global layers), shared by the layers using it.
        ropes = list({repr(layer.rope): layer.rope for layer in spec.layers}.values())  # scaling: a dict
        self.ropes = torch.nn.ModuleList(
            RotaryEmbedding(spec.head_dim, opt.max_positions, r.theta, r.scaling, opt.device, r.rotary_dim)
            for r in ropes)
        self.rope_of_layer = [ropes.index(layer.rope) for layer in spec.layers]

    def attention_layers(self) -> list[PagedAttention]:
        """Each layer's attention, in order (the runner binds each to its slice of the KV pool)."""
        return [layer.attn for layer in self.decoder_layers]

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata,
                logits_index: torch.Tensor) -> torch.Tensor:
        """Hidden states for all tokens, logits (float32) only at ``logits_index``."""
        x = self.embed(input_ids)
        if self.spec.embed_scale is not None:
            x = x * torch.tensor(self.spec.embed_scale, dtype=x.dtype)
        ropes = [cast(RotaryEmbedding, r) for r in self.ropes]
        tables = [r.lookup(positions) for r in ropes]  # once per step, not per layer
        for layer, i in zip(self.decoder_layers, self.rope_of_layer, strict=True):
            x = layer(x, ropes[i], tables[i], meta)
        x = self.norm(x[logits_index])
        logits = (self.embed.as_lm_head(x) if self.lm_head is None else self.lm_head(x)).float()
        if self.spec.logit_softcap:
            logits = torch.tanh(logits / self.spec.logit_softcap) * self.spec.logit_softcap
        return logits
