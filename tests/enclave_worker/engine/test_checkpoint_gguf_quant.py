"""GGUF Q4_0 / Q4_1 / Q4_K / Q8_0 / Q5_K / Q6_K tensors loaded into the engine's kernel layouts.

Q4_0, Q4_1 and Q8_0 are made by gguf's own quantizer; gguf 0.19 has no k-quant quantizer, so the
k-quant blocks are written to the format's specification (random codes and 6-bit scales, finite fp16
super-block scales). The reference is gguf's dequantize."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import GGML_QUANT_SIZES, dequantize, quantize

from enclave_worker.engine.checkpoint_gguf_quant import gguf_native
from enclave_worker.engine.errors import CheckpointError
from enclave_worker.engine.layers.quantized_linear import quantized_linear
from enclave_worker.engine.layers.quantized_weight import dequantize as dequantize_weight
from tests.enclave_worker.engine.quant_helpers import write_mixed_gguf

N, K = 128, 512
TEXT = ("The Industrial Revolution began in Great Britain in the late eighteenth century. New machines for "
        "spinning and weaving cotton changed how cloth was made, and steam engines supplied power to factories.")

# (type, scheme, bound on the relative error of the converted weight against gguf's dequantize)
CASES = [("Q4_0", "int4", 1e-6), ("Q4_1", "int4", 1e-6), ("Q4_K", "int4", 1e-6),
         ("Q8_0", "int8", 1e-6), ("Q5_K", "int8", 0.01), ("Q6_K", "int8", 0.01)]


def gguf_blocks(qtype: str, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    qt = GGMLQuantizationType[qtype]
    if qtype in ("Q4_0", "Q4_1", "Q8_0"):  # gguf's reference quantizer
        return quantize((rng.standard_normal((N, K)) * 0.05).astype(np.float32), qt)
    per_block, nbytes = GGML_QUANT_SIZES[qt]
    b = rng.integers(0, 256, (N, K // per_block, nbytes), dtype=np.uint8)
    d = (rng.uniform(0.002, 0.02, (N, K // per_block, 1))).astype(np.float16).view(np.uint8)
    if qtype == "Q6_K":  # ql[128] qh[64] scales[16] d
        b[..., -2:] = d
    else:  # d, dmin first
        b[..., 0:2] = d
        b[..., 2:4] = (rng.uniform(0.001, 0.01, (N, K // per_block, 1))).astype(np.float16).view(np.uint8)
    return b.reshape(N, -1)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize(("qtype", "scheme", "bound"), CASES)
def test_gguf_tensor_matches_gguf_dequantize(qtype, scheme, bound):
    data = gguf_blocks(qtype)
    ref = torch.from_numpy(dequantize(data, GGMLQuantizationType[qtype]).reshape(N, K).astype(np.float32))
    w = gguf_native(data, qtype, (N, K), "blk.0.ffn_up.weight")
    assert w.spec.scheme == scheme and w.spec.source == f"gguf:{qtype}"
    assert w.codes().nbytes <= N * K  # codes: at most a byte a weight, never float
    assert _rel(dequantize_weight(w), ref) < bound  # int4: the blocks' own values, exactly
    x = torch.randn(5, K, generator=torch.Generator().manual_seed(1))
    y = quantized_linear(w, None, torch.float32, "cpu")(x)
    # the int4 kernel rounds scales and activations to bf16; the int8 kernel quantizes activations per
    # block of 32 (~0.3% here), Q5_K / Q6_K add their requantization per block
    assert _rel(y, x @ ref.T) < bound + 0.01


def test_gguf_q8_0_codes_and_scales_are_the_blocks_own():
    """Q8_0 is kept exactly: codes are the blocks' int8 bytes, scales their fp16 d, and the weight they
    stand for is gguf's dequantization to the bit."""
    data = gguf_blocks("Q8_0")
    w = gguf_native(data, "Q8_0", (N, K), "t")
    blocks = data.reshape(N, K // 32, 34)
    assert w.spec.group_size == 32 and tuple(w.scales.shape) == (N, K // 32)
    assert np.array_equal(w.codes().numpy(), blocks[..., 2:].view(np.int8).reshape(N, K))
    assert np.array_equal(w.scales.numpy(), blocks[..., :2].copy().view(np.float16)[..., 0].astype(np.float32))
    ref = dequantize(data, GGMLQuantizationType.Q8_0).reshape(N, K).astype(np.float32)
    assert np.array_equal(dequantize_weight(w).numpy(), ref)


def test_gguf_q4_codes_are_the_blocks_own():
    """Q4_0's codes are the file's nibbles: weight j is the low nibble of byte j, 16 + j the high one."""
    data = gguf_blocks("Q4_0")
    w = gguf_native(data, "Q4_0", (N, K), "t")
    qs = data.reshape(N, K // 32, 18)[0, 0, 2:]
    codes = w.codes()[0, :16]
    first = torch.stack([codes & 0xF, codes >> 4], -1).reshape(-1)
    assert first.tolist() == list(np.concatenate([qs & 0xF, qs >> 4]))


@pytest.mark.parametrize(("qtype", "mutate", "message"), [
    ("Q4_0", lambda d: d[:, :-1], "does not fit"),  # truncated by one byte a row
    ("Q4_K", lambda d: d.reshape(-1)[:-144], "does not fit"),  # one block short
    ("Q8_0", lambda d: d.view(np.int8), "does not fit"),  # not bytes
    ("Q5_0", lambda d: d, "the engine loads"),  # a type without a path
    ("IQ2_XS", lambda d: d, "the engine loads"),
])
def test_gguf_bad_tensors_refused(qtype, mutate, message):
    data = gguf_blocks("Q4_0" if qtype in ("Q5_0", "IQ2_XS") else qtype)
    with pytest.raises(CheckpointError, match=message):
        gguf_native(mutate(data), qtype, (N, K), "blk.0.attn_q.weight")


def test_gguf_shape_mismatch_refused():
    data = gguf_blocks("Q4_1")
    with pytest.raises(CheckpointError, match="does not fit"):
        gguf_native(data, "Q4_1", (N, K + 32), "t")  # one block more than the file holds
    with pytest.raises(CheckpointError, match="does not fit"):
        gguf_native(data, "Q4_1", (N, K - 16), "t")  # not whole blocks
    with pytest.raises(CheckpointError, match="2-D"):
        gguf_native(data, "Q4_1", (N, K, 1), "t")


def test_gguf_non_finite_scale_refused():
    data = gguf_blocks("Q4_0").copy()
    data.reshape(N, K // 32, 18)[3, 2, 0:2] = np.array([np.inf], np.float16).view(np.uint8)
    with pytest.raises(CheckpointError, match="non-finite"):
        gguf_native(data, "Q4_0", (N, K), "t")


# ---------------------------------------------------------------- whole models, natively


@pytest.fixture(scope="module")
def mixed_gguf(tmp_path_factory):
    path = tmp_path_factory.mktemp("gguf") / "mixed.gguf"
    write_mixed_gguf(path)
    return path


@pytest.fixture(scope="module")
def small_mixed_gguf(tmp_path_factory):
    path = tmp_path_factory.mktemp("gguf") / "small.gguf"
    write_mixed_gguf(path, layers=2, inter=1024)
    return path


def test_gguf_loads_natively_without_an_fp32_model(mixed_gguf):
    """The native load peaks under 3/4 of the linears' fp32 size (it holds codes and scales, 1/5 to 1/4 of
    it, the mapped file and per-tensor transients) and below the fp32 load's peak by more than half of it."""
    from tests.enclave_worker.engine.quant_helpers import peak_load_bytes

    (native, dense), linears_fp32 = peak_load_bytes(f"checkpoint.load_gguf({str(mixed_gguf)!r}, native=True)",
                                                    f"checkpoint.load_gguf({str(mixed_gguf)!r})")
    assert linears_fp32 == 4 * 4 * (2 * 1024 * 1024 + 2 * 256 * 1024 + 3 * 4096 * 1024)
    assert native < linears_fp32 * 3 // 4, (native, dense, linears_fp32)
    assert dense - native > linears_fp32 // 2, (native, dense, linears_fp32)


def _logits(engine, ids: list[int]) -> torch.Tensor:
    """Every position's logits of one teacher-forced prefill (as perplexity.py runs it)."""
    import secrets

    from enclave_worker.engine.config import SamplingParams
    from enclave_worker.engine.scheduler import ScheduledSeq
    from enclave_worker.engine.sequence import Sequence

    seq = Sequence(-1, "", list(ids), len(ids), SamplingParams(), 1, secrets.token_bytes(16))
    with engine._step_lock, engine._cond:
        engine.blocks.allocate(seq)
        try:
            input_ids, positions, meta, _ = engine.runner.prepare([ScheduledSeq(seq, 0, len(ids))])
            return engine.runner.forward(input_ids, positions, meta, list(range(len(ids))))
        finally:
            engine.blocks.free_seq(seq)


def test_mixed_gguf_native_model_matches_the_reference_dequantization(small_mixed_gguf):
    """The whole model in the files' own codes (mixed QKV as row blocks) against the same model built from
    gguf's reference dequantization in fp32: logits within 3% relative L2 (bf16 in the int4 kernel, Q6_K
    requantized per block of 32, activations quantized per block in the int8 kernel), most positions'
    argmax the same; the wipe zeroes every layout."""
    from enclave_worker.engine import EngineConfig, LLMEngine
    from enclave_worker.engine.checkpoint import load_gguf
    from enclave_worker.engine.layers.packed import is_zero
    from enclave_worker.engine.layers.quantized_linear import PrequantizedInt4Linear, RowBlocksLinear

    cfg = EngineConfig(max_num_seqs=2, kv_cache_memory_bytes=16 << 20, num_threads=1, max_model_len=128)
    native = LLMEngine.from_checkpoint(load_gguf(small_mixed_gguf, native=True), cfg)
    layer = native.model.layers[0]
    assert isinstance(layer.qkv_proj, RowBlocksLinear) and isinstance(layer.gate_up_proj, PrequantizedInt4Linear)
    ids = torch.randint(0, 256, (48,), generator=torch.Generator().manual_seed(0)).tolist()
    got = _logits(native, ids)
    # the revocation wipe reaches the quantized layers' own layouts, row blocks included
    held = native.held_tensors()
    v_part = layer.qkv_proj.parts[-1]
    assert any(t is v_part.matmul.codes for t in held) and any(t is v_part.matmul.scales for t in held)
    assert any(t is layer.gate_up_proj.packed for t in held)
    native.wipe()
    assert all(is_zero(t) for t in native.held_tensors())
    del native
    ref = _logits(LLMEngine.from_checkpoint(load_gguf(small_mixed_gguf), cfg), ids)
    rel = float((got - ref).norm() / ref.norm())
    assert rel < 0.03, rel
    assert float((got.argmax(-1) == ref.argmax(-1)).float().mean()) > 0.9


def test_default_gguf_native_engine_matches_the_dequantized_one(gguf_path, engine, h):
    """The whole model through the int4 kernel over the file's own codes: perplexity within 5% of the
    fp32 engine built from gguf's reference dequantization, and the same answer."""
    from enclave_worker.engine import EngineConfig, LLMEngine, SamplingParams
    from enclave_worker.engine.checkpoint import load_gguf
    from enclave_worker.engine.layers.quantized_linear import PrequantizedInt4Linear
    from tests.enclave_worker.engine.perplexity import perplexity

    native = LLMEngine.from_checkpoint(load_gguf(gguf_path, native=True),
                                       EngineConfig(max_num_seqs=2, kv_cache_memory_bytes=16 << 20, num_threads=1))
    assert isinstance(native.model.layers[0].gate_up_proj, PrequantizedInt4Linear)
    ids = engine.tokenizer.encode(TEXT)
    ppl, ref = perplexity(native, ids), perplexity(engine, ids)
    assert abs(ppl - ref) / ref < 0.05, (ppl, ref)
    prompt = native.tokenizer.encode("The capital of France is")
    outs = h.run_sync(native, [("q", prompt, SamplingParams(max_tokens=6, temperature=0))])["q"]
    assert "Paris" in "".join(o.delta_text for o in outs)


# ---------------------------------------------------------------- memory at load (issue 49)


@pytest.fixture(scope="module")
def q8_gguf(tmp_path_factory):
    """Every linear and the token table in Q8_0 (as `make-model --gguf Q8_0` and llama.cpp's converter)."""
    path = tmp_path_factory.mktemp("gguf") / "q8.gguf"
    write_mixed_gguf(path, layers=2, inter=2048, vocab=4096, qtype="Q8_0", embedding="Q8_0")
    return path


def test_q8_0_load_peaks_near_the_codes_it_holds(q8_gguf):
    """The native load reads each tensor into its own buffer and keeps codes and scales: its peak is the
    bytes it holds plus per-tensor transients. Read through the reader's map, every page of the file
    stayed resident beside the codes (~2x); with the table dequantized to float32, the table's 4 bytes a
    weight came on top."""
    from tests.enclave_worker.engine.quant_helpers import peak_loads

    (row,) = peak_loads(f"checkpoint.load_gguf({str(q8_gguf)!r}, native=True)",
                        warm_up=(f"checkpoint.load_gguf({str(q8_gguf)!r}, native=True)",))
    file_bytes = q8_gguf.stat().st_size
    assert row["held"] > file_bytes * 0.95, (row, file_bytes)  # the codes are the file's size, near enough
    assert row["peak"] < row["held"] * 1.4, (row, file_bytes)


def test_q8_0_table_is_kept_as_its_codes(q8_gguf):
    """The Q8_0 token table loads as its own codes and scales; the CPU's int8 engine takes them as they
    are (the same table as requantizing gguf's float32 dequantization, so the same logits), and an fp32
    engine dequantizes it, as before."""
    from enclave_worker.engine import EngineConfig, LLMEngine
    from enclave_worker.engine.checkpoint import load_gguf
    from enclave_worker.engine.layers.quantized_weight import QuantizedWeight

    ck = load_gguf(q8_gguf, native=True)
    table = ck.tensors["model.embed_tokens.weight"]
    assert isinstance(table, QuantizedWeight) and table.spec.source == "gguf:Q8_0"
    ref_table = dequantize_weight(table)
    assert torch.equal(ref_table, load_gguf(q8_gguf).tensors["model.embed_tokens.weight"])
    cfg = EngineConfig(dtype="int8", max_num_seqs=2, kv_cache_memory_bytes=16 << 20, num_threads=1, max_model_len=128)
    native = LLMEngine.from_checkpoint(ck, cfg)
    ids = torch.randint(0, 4096, (24,), generator=torch.Generator().manual_seed(0)).tolist()
    assert torch.equal(native.model.embed(torch.tensor(ids)), ref_table[ids])
    got = _logits(native, ids)
    ref = _logits(LLMEngine.from_checkpoint(load_gguf(q8_gguf), cfg), ids)  # the table from float32, requantized
    assert float((got - ref).norm() / ref.norm()) < 1e-5
    fp32 = LLMEngine.from_checkpoint(load_gguf(q8_gguf, native=True), dataclasses.replace(cfg, dtype="float32"))
    assert torch.equal(fp32.model.embed(torch.tensor(ids)), ref_table[ids])
