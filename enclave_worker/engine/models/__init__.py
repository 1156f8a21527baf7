"""Model architectures (HF names -> builders)."""

from __future__ import annotations

import torch

from .llama import LlamaForCausalLM

ARCHITECTURES = {
    "LlamaForCausalLM": LlamaForCausalLM,
    "MistralForCausalLM": LlamaForCausalLM,
    "Qwen2ForCausalLM": LlamaForCausalLM,
}


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
