"""Tiny checkpoints of each supported family, made with `transformers` from a small config (seeded
random weights, float32) and written with save_pretrained as safetensors, plus a byte-level tokenizer
built with `tokenizers` (256 byte tokens and four specials) and a small chat template."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

SPECIALS = ["<s>", "</s>", "<|user|>", "<|assistant|>"]  # ids 256..259
VOCAB = 320  # > the tokenizer's 260: the rows past it are never produced by text, only by the model
TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}</s>{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>{% endif %}")

_COMMON: dict[str, Any] = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                               bos_token_id=256, eos_token_id=257, pad_token_id=0, initializer_range=0.15,
                               tie_word_embeddings=False)

# family -> (transformers config class name, its overrides)
FAMILIES: dict[str, tuple[str, dict[str, Any]]] = {
    "llama3": ("LlamaConfig", dict(rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                 "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
                                   rope_theta=500000.0)),
    "mistral": ("MistralConfig", dict(sliding_window=12, head_dim=16)),
    "qwen2": ("Qwen2Config", dict(tie_word_embeddings=True)),
    "qwen3": ("Qwen3Config", dict(head_dim=32)),
    "gemma2": ("Gemma2Config", dict(head_dim=16, sliding_window=12, query_pre_attn_scalar=16,
                                    attn_logit_softcapping=5.0, final_logit_softcapping=3.0,
                                    tie_word_embeddings=True, num_hidden_layers=4)),
    "gemma3": ("Gemma3TextConfig", dict(head_dim=16, sliding_window=12, query_pre_attn_scalar=16,
                                        layer_types=["sliding_attention", "sliding_attention", "full_attention",
                                                     "sliding_attention"],
                                        rope_parameters={"full_attention": {"rope_type": "linear", "factor": 2.0,
                                                                            "rope_theta": 1000000.0},
                                                         "sliding_attention": {"rope_type": "default",
                                                                               "rope_theta": 10000.0}},
                                        tie_word_embeddings=True, num_hidden_layers=4)),
    "phi3": ("Phi3Config", dict(partial_rotary_factor=0.75, original_max_position_embeddings=256,
                                rope_scaling={"type": "longrope", "short_factor": [1.0, 1.2, 1.5, 2.0, 2.5, 3.0],
                                              "long_factor": [2.0, 3.0, 4.0, 5.0, 6.0, 8.0]})),
    "mixtral": ("MixtralConfig", dict(num_local_experts=4, num_experts_per_tok=2)),
    "qwen3_moe": ("Qwen3MoeConfig", dict(num_experts=6, num_experts_per_tok=2, moe_intermediate_size=32,
                                         norm_topk_prob=True, head_dim=16)),
}


def tokenizer_json() -> str:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from tokenizers.pre_tokenizers import ByteLevel

    alphabet = ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIALS)
    return str(tok.to_str())


def hf_config(family: str, **changes: Any) -> Any:
    import transformers

    cls_name, overrides = FAMILIES[family]
    return getattr(transformers, cls_name)(**{**_COMMON, **overrides, **changes})


def build(family: str, out: Path, seed: int = 0, **changes: Any) -> Any:
    """Write the family's tiny checkpoint into ``out`` (an HF model directory); returns the HF model.
    `changes`: config values over the family's (a longer context for prompts with tools)."""
    import transformers

    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(hf_config(family, **changes), dtype=torch.float32).eval()
    with torch.no_grad():  # norms start at 1 (Gemma's at 0): give them spread, so a wrong norm shows
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(torch.randn_like(p) * 0.3)
    model.save_pretrained(out, safe_serialization=True)
    (out / "tokenizer.json").write_text(tokenizer_json())
    (out / "tokenizer_config.json").write_text(json.dumps(
        {"chat_template": TEMPLATE, "bos_token": "<s>", "eos_token": "</s>"}))
    return model
