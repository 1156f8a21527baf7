"""Model architectures: the registry from HF ``architectures`` / ``model_type`` to the builder.

Families whose math is exactly Llama's (SmolLM2, Llama 3.x, Qwen2/2.5, Mistral without a window)
build ``LlamaForCausalLM`` (llama.py, with its fused CPU and GPU kernels); every other supported
family builds ``DecoderForCausalLM`` (causal_lm.py) from its ``DecoderSpec`` (spec.py). A config
naming anything else is refused with one line (``check_architecture``, also run by ``sealed encrypt``
before it packs a model), pointing to the vLLM backend."""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any

import torch

from .causal_lm import DecoderForCausalLM
from .llama import LlamaForCausalLM
from .options import BuildOptions
from .spec import DecoderSpec, UnsupportedArchitecture, decoder_spec

CausalLM = LlamaForCausalLM | DecoderForCausalLM

# HF architecture name -> family (spec.py's reading of its config).
ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "llama",
    "Qwen2ForCausalLM": "llama",
    "Qwen3ForCausalLM": "llama",
    "Gemma2ForCausalLM": "gemma",
    "Gemma3ForCausalLM": "gemma",
    "Phi3ForCausalLM": "phi3",
    "MixtralForCausalLM": "mixtral",
    "Qwen3MoeForCausalLM": "qwen3_moe",
}
# model_type -> architecture, for a config without ``architectures``.
MODEL_TYPES = {
    "llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM", "gemma2": "Gemma2ForCausalLM", "gemma3_text": "Gemma3ForCausalLM",
    "phi3": "Phi3ForCausalLM", "mixtral": "MixtralForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM",
}
VLLM_HINT = "serve it with the vLLM backend (worker engine: vllm, docs/vllm-backend.md)"


def architecture_of(cfg: dict[str, Any]) -> str:
    names = cfg.get("architectures") or [MODEL_TYPES.get(str(cfg.get("model_type")), "LlamaForCausalLM")]
    return str(names[0])


def check_architecture(cfg: dict[str, Any]) -> DecoderSpec:
    """The spec the engine would build from this config; UnsupportedArchitecture (one line naming what
    is unsupported and pointing to the vLLM backend) where the engine cannot run it."""
    arch = architecture_of(cfg)
    family = ARCHITECTURES.get(arch)
    if family is None:
        raise UnsupportedArchitecture(f"architecture {arch!r} is not supported by the sealed engine "
                                      f"(it runs {', '.join(sorted(ARCHITECTURES))}); {VLLM_HINT}")
    try:
        return decoder_spec(cfg, family)
    except UnsupportedArchitecture as exc:
        raise UnsupportedArchitecture(f"{arch}: {exc}; {VLLM_HINT}") from None
    except (KeyError, TypeError, ValueError) as exc:
        raise UnsupportedArchitecture(f"{arch}: config.json is incomplete or malformed "
                                      f"({type(exc).__name__}: {exc})") from None


def build_architecture(cfg: dict[str, Any], tensors: MutableMapping[str, torch.Tensor], opt: BuildOptions) -> CausalLM:
    """The model for this config, consuming ``tensors``."""
    spec = check_architecture(cfg)
    if spec.plain_llama:
        return LlamaForCausalLM(cfg, tensors, opt)
    return DecoderForCausalLM(spec, tensors, opt)


def model_tensors(model: torch.nn.Module) -> list[torch.Tensor]:
    """The layers keep plain tensor attributes, not registered parameters (``state_dict()`` misses
    them): walk each module's attributes and the kernel helpers they own (e.g. DenseMatmul)."""
    found: dict[int, torch.Tensor] = {}

    def add(obj: object) -> None:
        for value in vars(obj).values():
            if isinstance(value, torch.Tensor):
                found.setdefault(id(value), value)

    for module in model.modules():
        add(module)
        for value in vars(module).values():
            if not isinstance(value, torch.nn.Module) and hasattr(value, "__dict__"):
                add(value)
    return list(found.values())
