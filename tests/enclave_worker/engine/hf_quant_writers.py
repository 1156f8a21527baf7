"""HF quantized checkpoints written in the tests: AWQ and GPTQ packed to the formats' written layouts,
compressed-tensors layers made by the compressed-tensors package, and model directories holding them."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file

N, K, G = 192, 512, 128
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)


def write_dir(path: Path, tensors: dict[str, torch.Tensor], quantization_config: dict | None = None,
              shards: int = 2) -> Path:
    """An HF model directory: config.json, tokenizer.json, ``shards`` safetensors files and their index."""
    path.mkdir(parents=True, exist_ok=True)
    config = {"architectures": ["LlamaForCausalLM"], "hidden_size": K}
    if quantization_config:
        config["quantization_config"] = quantization_config
    (path / "config.json").write_text(json.dumps(config))
    (path / "tokenizer.json").write_text("{}")
    names = sorted(tensors)
    weight_map = {}
    for i in range(shards):
        part = names[i::shards]
        fname = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        save_file({n: tensors[n].contiguous() for n in part}, str(path / fname))
        weight_map.update(dict.fromkeys(part, fname))
    (path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return path


def pack_u32(nibbles: np.ndarray) -> torch.Tensor:
    """[..., 8] values 0..15, nibble i -> bits 4i..4i+3 of one int32."""
    words = np.zeros(nibbles.shape[:-1], np.uint32)
    for i in range(8):
        words |= nibbles[..., i].astype(np.uint32) << np.uint32(4 * i)
    return torch.from_numpy(words.view(np.int32))


def awq_layer(rng: np.random.Generator, n: int = N, k: int = K, g: int = G):
    q = rng.integers(0, 16, (k, n))
    z = rng.integers(0, 16, (k // g, n))
    s = rng.uniform(0.001, 0.01, (k // g, n)).astype(np.float16)
    order = list(AWQ_ORDER)
    tensors = {"qweight": pack_u32(q.reshape(k, n // 8, 8)[..., order]),
               "qzeros": pack_u32(z.reshape(k // g, n // 8, 8)[..., order]), "scales": torch.from_numpy(s)}
    ref = (q - np.repeat(z, g, 0)) * np.repeat(s.astype(np.float32), g, 0)  # [K, N]
    return tensors, torch.from_numpy(ref.T.astype(np.float32))


def gptq_layer(rng: np.random.Generator, act_order: bool, n: int = N, k: int = K, g: int = G):
    q = rng.integers(0, 16, (k, n))
    z = rng.integers(1, 16, (k // g, n))
    s = rng.uniform(0.001, 0.01, (k // g, n)).astype(np.float16)
    g_idx = np.arange(k) // g
    if act_order:
        g_idx = rng.permutation(g_idx)
    tensors = {"qweight": pack_u32(q.reshape(k // 8, 8, n).transpose(0, 2, 1)),
               "qzeros": pack_u32((z - 1).reshape(k // g, n // 8, 8)), "scales": torch.from_numpy(s),
               "g_idx": torch.from_numpy(g_idx.astype(np.int32))}
    ref = (q - z[g_idx]) * s.astype(np.float32)[g_idx]
    return tensors, torch.from_numpy(ref.T.astype(np.float32))


def ct_layer(rng: np.random.Generator, preset: str, strategy: str | None = None, symmetric: bool = True,
             n: int = N, k: int = K):
    """A layer compressed by compressed-tensors; the reference is its own decompress."""
    from compressed_tensors.compressors.base import BaseCompressor
    from compressed_tensors.quantization import preset_name_to_scheme
    from compressed_tensors.quantization.utils import calculate_qparams

    scheme = preset_name_to_scheme(preset, ["Linear"])
    if strategy or not symmetric:
        upd = {"symmetric": symmetric} | ({"strategy": strategy} if strategy else {})
        if strategy == "channel":
            upd["group_size"] = None
        scheme.weights = scheme.weights.model_copy(update=upd)
    a = scheme.weights
    w = torch.from_numpy(rng.standard_normal((n, k)).astype(np.float32) * 0.05)
    if a.strategy == "group":
        view = w.reshape(n, k // a.group_size, a.group_size)
    elif a.strategy == "channel":
        view = w.reshape(n, 1, k)
    else:
        view = w.reshape(1, 1, -1)
    scale, zp = calculate_qparams(view.amin(-1), view.amax(-1), a)
    fmt = "pack-quantized" if a.type == "int" else "float-quantized"
    comp = BaseCompressor.load_from_registry(fmt)
    state = {"weight": w, "weight_scale": scale, "weight_zero_point": zp}
    out = comp.compress(state, scheme)
    ref = comp.decompress(dict(out), scheme)["weight"].float()
    groups = {"group_0": {"targets": ["Linear"], "weights": a.model_dump(mode="json"), "format": fmt}}
    return out, ref, {"quant_method": "compressed-tensors", "format": fmt, "config_groups": groups}
