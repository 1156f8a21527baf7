"""The architecture registry: which builder each family gets (SmolLM2 and plain Llama math keep the
Llama decoder and its fused kernels), the one-line refusals, and Phi-3's longrope table against HF's."""

from __future__ import annotations

import pytest
import torch

from enclave_worker.engine.errors import EngineError
from enclave_worker.engine.layers.rotary import RotaryEmbedding
from enclave_worker.engine.models import check_architecture
from enclave_worker.engine.models.spec import UnsupportedArchitecture
from tests.enclave_worker.engine.models.tiny import FAMILIES, hf_config

PLAIN_LLAMA = {"llama3", "qwen2"}  # the rest need the generic decoder (window, q/k norm, Gemma, Phi-3, experts)


def test_smollm2_keeps_the_llama_decoder(checkpoint) -> None:
    assert check_architecture(checkpoint.config).plain_llama


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_family_builder(family: str) -> None:
    spec = check_architecture(hf_config(family).to_dict())
    assert spec.plain_llama == (family in PLAIN_LLAMA)


def test_mistral_without_a_window_is_plain_llama() -> None:
    cfg = hf_config("mistral").to_dict() | {"sliding_window": None}
    assert check_architecture(cfg).plain_llama


def test_gemma3_layers_take_their_own_rope_and_window() -> None:
    spec = check_architecture(hf_config("gemma3").to_dict())
    local, _, full, _ = spec.layers
    assert (local.window, full.window) == (12, None)
    assert local.rope.theta == 10000.0 and local.rope.scaling is None
    assert full.rope.theta == 1000000.0 and full.rope.scaling is not None and full.rope.scaling["factor"] == 2.0


@pytest.mark.parametrize(("config", "named"), [
    ({"architectures": ["FalconForCausalLM"]}, "FalconForCausalLM"),
    ({"architectures": ["LlamaForCausalLM"], "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
      "num_attention_heads": 2, "vocab_size": 40, "rope_scaling": {"type": "dynamic", "factor": 2.0}}, "dynamic"),
    ({"architectures": ["Phi3ForCausalLM"]}, "malformed"),  # no sizes at all
])
def test_refusals_are_one_typed_line(config: dict, named: str) -> None:
    with pytest.raises(UnsupportedArchitecture) as err:
        check_architecture(config)
    assert isinstance(err.value, EngineError) and named in str(err.value) and "\n" not in str(err.value)


def test_longrope_rows_match_hf_short_and_long() -> None:
    from transformers.models.phi3.modeling_phi3 import Phi3RotaryEmbedding

    config = hf_config("phi3")
    config.original_max_position_embeddings = 16
    config.rope_parameters["original_max_position_embeddings"] = 16
    spec = check_architecture(config.to_dict()).layers[0].rope
    ours = RotaryEmbedding(16, 64, spec.theta, spec.scaling, "cpu", spec.rotary_dim)
    hf = Phi3RotaryEmbedding(config)
    x = torch.zeros(1, 1, 16)
    for positions, rows in ((torch.arange(16), slice(0, 16)), (torch.arange(40), slice(16, 40))):
        cos, sin = hf(x, positions[None])  # HF: short factors up to the original length, long beyond
        assert torch.allclose(ours.cos[rows], cos[0, rows], atol=1e-5)
        assert torch.allclose(ours.sin_signed[rows, spec.rotary_dim // 2 :], sin[0, rows, : spec.rotary_dim // 2],
                              atol=1e-5)
