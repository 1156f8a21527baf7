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
def status(key):
    for line in open('/proc/self/status'):
        if line.startswith(key):
            return int(line.split()[1]) * 1024
def reset_hwm():  # Linux >= 4.0: '5' resets the peak resident set size to the current one
    with open('/proc/self/clear_refs', 'w') as f:
        f.write('5')
import ctypes, torch, numpy, gguf  # imported before the baseline
libc = ctypes.CDLL("libc.so.6")
from enclave_worker.engine import checkpoint
from enclave_worker.engine.layers.quantized_weight import QuantizedWeight
def components(t):
    parts = [p for q in t.parts for p in components(q)] if t.parts else [t.codes(), t.scales, t.zeros, t.perm]
    return [p for p in parts if p is not None]
def fp32_bytes(t):
    return 4 * (t.spec.shape[0] * t.spec.shape[1] if isinstance(t, QuantizedWeight) else t.numel())
for call in {warm_up!r}:  # one-time costs of a reader (imports, caches) out of the measured calls
    eval(call)
gc.collect()
libc.malloc_trim(0)
rows = []
for call in {calls!r}:
    gc.collect()
    reset_hwm()
    base = status('VmRSS:')
    ck = eval(call)
    peak = status('VmHWM:') - base
    quantized = sum(fp32_bytes(t) for t in ck.tensors.values() if isinstance(t, QuantizedWeight))
    held = sum(c.nbytes for t in ck.tensors.values()
               for c in (components(t) if isinstance(t, QuantizedWeight) else [t]))
    rows.append({{"peak": peak, "quantized_fp32": quantized, "fp32": sum(map(fp32_bytes, ck.tensors.values())),
                 "held": held}})
    del ck
    gc.collect()
    libc.malloc_trim(0)  # freed heap back to the system: the next call's baseline is what is live
print(json.dumps(rows))
"""


def peak_loads(*calls: str, warm_up: tuple[str, ...] = ()) -> list[dict[str, int]]:
    """For each of ``calls`` (expressions over ``checkpoint``, run in order in one fresh interpreter):
    ``peak``, the growth of the resident set from just before the call to its high-water mark during it
    (the mark is reset before each call, so each peak is its own and counts every transient copy and
    every page of a mapped file the load touched; ``warm_up`` calls run first, unmeasured); ``fp32``,
    the float32 size of every tensor loaded (quantized weights at their logical shape);
    ``quantized_fp32``, that of the quantized weights only; ``held``, the bytes the loaded tensors hold
    (a quantized weight's codes, scales, zeros and permutation)."""
    # A fixed mmap threshold: glibc otherwise raises it as large blocks are freed, keeps the next ones on its
    # heap, and a later call's baseline would count memory an earlier one freed.
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "MALLOC_MMAP_THRESHOLD_": str(1 << 20)}
    out = subprocess.run([sys.executable, "-c", _PROBE.format(calls=list(calls), warm_up=list(warm_up))],
                         capture_output=True, text=True, env=env, cwd=ROOT, timeout=600, check=True)
    rows: list[dict[str, int]] = json.loads(out.stdout.strip().splitlines()[-1])
    return rows


def peak_load_bytes(*calls: str) -> tuple[list[int], int]:
    """Each call's peak (``peak_loads``) and the float32 size of the largest load's quantized weights."""
    rows = peak_loads(*calls)
    return [r["peak"] for r in rows], max(r["quantized_fp32"] for r in rows)


def write_mixed_gguf(path, hidden: int = 1024, inter: int = 4096, layers: int = 4, vocab: int = 256,
                     d_range: tuple[float, float] = (0.0002, 0.0008), qtype: str | None = None,
                     embedding: str = "F32") -> None:
    """A Llama GGUF mixing every native type the way llama.cpp's k-quant mixes do (Q: Q4_0, K: Q4_K,
    V: Q6_K, O: Q4_1, gate / up: Q4_K, down: Q8_0), blocks written to the spec; 232 MB of linears as fp32.
    Block scales ``d_range``: small enough that a random 4-layer stack is not chaotic (at 0.001-0.004 a
    bf16 rounding grows to 25% of the logits), large enough that the layers move the logits by more
    than twice their norm (measured with the layers zeroed).

    ``qtype``: every linear of that one type instead; Q4_0, Q4_1 and Q8_0 are then made by gguf's own
    quantizer from float weights of the same scale (gguf 0.19 has no k-quant quantizer: k-quant blocks
    are always written to the spec). ``embedding``: the token table's type, F32 or Q8_0 (gguf's quantizer,
    as llama.cpp's converter writes it with ``--outtype q8_0``)."""
    import gguf
    from gguf.quants import quantize as gguf_quantize

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
    table = (rng.standard_normal((vocab, hidden)) * 0.5).astype(np.float32)
    if embedding == "Q8_0":
        q8 = gguf.GGMLQuantizationType.Q8_0
        w.add_tensor("token_embd.weight", np.asarray(gguf_quantize(table, q8)), raw_dtype=q8)
    else:
        w.add_tensor("token_embd.weight", table)
    w.add_tensor("output_norm.weight", np.ones(hidden, np.float32))
    kv = hidden // 4
    types = {"attn_q": ("Q4_0", hidden, hidden), "attn_k": ("Q4_K", kv, hidden), "attn_v": ("Q6_K", kv, hidden),
             "attn_output": ("Q4_1", hidden, hidden), "ffn_gate": ("Q4_K", inter, hidden),
             "ffn_up": ("Q4_K", inter, hidden), "ffn_down": ("Q8_0", hidden, inter)}
    if qtype is not None:
        types = {name: (qtype, rows, cols) for name, (_, rows, cols) in types.items()}
    for i in range(layers):
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(hidden, np.float32))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(hidden, np.float32))
        for name, (t, rows, cols) in types.items():
            blocks = _gguf_blocks(rng, t, rows, cols, d_range, quantize=qtype is not None)
            w.add_tensor(f"blk.{i}.{name}.weight", blocks, raw_dtype=gguf.GGMLQuantizationType[t])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _gguf_blocks(rng: np.random.Generator, qtype: str, rows: int, cols: int, d_range: tuple[float, float],
                 quantize: bool) -> np.ndarray:
    """One tensor's blocks: gguf's quantizer over float weights where it has one (and ``quantize``),
    else random codes with finite fp16 scales in ``d_range`` at the spec's offsets."""
    import gguf
    from gguf.quants import quantize as gguf_quantize

    qt = gguf.GGMLQuantizationType[qtype]
    if quantize and qtype in ("Q4_0", "Q4_1", "Q8_0"):
        scale = float(np.mean(d_range)) * (127 if qtype == "Q8_0" else 8) / 3  # |w| max ~3 sigma: d in d_range
        return np.asarray(gguf_quantize((rng.standard_normal((rows, cols)) * scale).astype(np.float32), qt))
    per_block, nbytes = gguf.GGML_QUANT_SIZES[qt]
    b = rng.integers(0, 256, (rows, cols // per_block, nbytes), dtype=np.uint8)
    d = rng.uniform(*d_range, (rows, cols // per_block, 1)).astype(np.float16).view(np.uint8)
    b[..., -2:] = d  # Q6_K's d (the others' last bytes are codes)
    if qtype != "Q6_K":
        b[..., 0:2] = d
    if qtype in ("Q4_1", "Q4_K", "Q5_K"):  # m (Q4_1) or dmin (k-quants) right after d
        b[..., 2:4] = (d.view(np.float16) / 2).view(np.uint8)
    return b.reshape(rows, -1)
