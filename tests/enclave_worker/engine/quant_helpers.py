"""Shared by the checkpoint-format tests: peak resident memory of loads, run in a fresh interpreter."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[3]

_PROBE = """
import gc, json
def hwm():
    for line in open('/proc/self/status'):
        if line.startswith('VmHWM:'):
            return int(line.split()[1]) * 1024
import torch, numpy, gguf  # imported before the baseline
from enclave_worker.engine import checkpoint
from enclave_worker.engine.layers.quantized_weight import QuantizedWeight
base, peaks, quantized_fp32 = hwm(), [], 0
for call in {calls!r}:
    ck = eval(call)
    peaks.append(hwm() - base)
    quantized_fp32 = max(quantized_fp32, sum(4 * t.spec.shape[0] * t.spec.shape[1] for t in ck.tensors.values()
                                             if isinstance(t, QuantizedWeight)))
    del ck
    gc.collect()
print(json.dumps({{"peaks": peaks, "quantized_fp32": quantized_fp32}}))
"""


def peak_load_bytes(*calls: str) -> tuple[list[int], int]:
    """VmHWM growth (bytes) after each of ``calls`` (expressions over ``checkpoint``, run in order in one
    fresh interpreter: the high-water mark only rises, so order the smaller load first), and the float32
    size of the largest load's quantized weights. The peak counts every transient copy of a load."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", _PROBE.format(calls=list(calls))], capture_output=True, text=True,
                         env=env, cwd=ROOT, timeout=600, check=True)
    doc = json.loads(out.stdout.strip().splitlines()[-1])
    return [int(p) for p in doc["peaks"]], int(doc["quantized_fp32"])


def write_mixed_gguf(path, hidden: int = 1024, inter: int = 4096, layers: int = 4, vocab: int = 256,
                     d_range: tuple[float, float] = (0.0002, 0.0008)) -> None:
    """A Llama GGUF mixing every native type the way llama.cpp's k-quant mixes do (Q: Q4_0, K: Q4_K,
    V: Q6_K, O: Q4_1, gate / up: Q4_K, down: Q8_0), blocks written to the spec; 232 MB of linears as fp32.
    Block scales ``d_range``: small enough that a random 4-layer stack is not chaotic (at 0.001-0.004 a
    bf16 rounding grows to 25% of the logits), large enough that the layers move the logits by more
    than twice their norm (measured with the layers zeroed)."""
    import gguf

    rng = np.random.default_rng(0)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(layers)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(inter)
    w.add_head_count(16)
    w.add_head_count_kv(4)
    w.add_context_length(256)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_tokenizer_model("gpt2")
    w.add_token_list([f"<{i}>" for i in range(vocab)])
    w.add_token_merges([])
    w.add_eos_token_id(0)
    w.add_tensor("token_embd.weight", (rng.standard_normal((vocab, hidden)) * 0.5).astype(np.float32))
    w.add_tensor("output_norm.weight", np.ones(hidden, np.float32))
    kv = hidden // 4
    types = {"attn_q": ("Q4_0", hidden, hidden), "attn_k": ("Q4_K", kv, hidden), "attn_v": ("Q6_K", kv, hidden),
             "attn_output": ("Q4_1", hidden, hidden), "ffn_gate": ("Q4_K", inter, hidden),
             "ffn_up": ("Q4_K", inter, hidden), "ffn_down": ("Q8_0", hidden, inter)}
    for i in range(layers):
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(hidden, np.float32))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(hidden, np.float32))
        for name, (qtype, rows, cols) in types.items():
            qt = gguf.GGMLQuantizationType[qtype]
            per_block, nbytes = gguf.GGML_QUANT_SIZES[qt]
            b = rng.integers(0, 256, (rows, cols // per_block, nbytes), dtype=np.uint8)
            d = rng.uniform(*d_range, (rows, cols // per_block, 1)).astype(np.float16).view(np.uint8)
            b[..., -2:] = d  # Q6_K's d (the others' last bytes are codes)
            if qtype != "Q6_K":
                b[..., 0:2] = d
            if qtype in ("Q4_1", "Q4_K"):
                b[..., 2:4] = (d.view(np.float16) / 2).view(np.uint8)
            w.add_tensor(f"blk.{i}.{name}.weight", b.reshape(rows, -1), raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
