"""fp32 weights exactly on a block grid held as int8 codes (EngineConfig.panel_codes,
layers/coded_panel.py, kernels/cpu_linear.cpp): the fp32 panels' results to the bit at every row
count, real GGUF blocks (Q4_1, Q8_0) recognised, anything off the grid left in fp32 untouched, the
default model's every layer coded with the same greedy tokens, and the codes wiped with the rest."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType

from enclave_worker.engine import SamplingParams
from enclave_worker.engine.kernels.cpu_ops import load_cpu_ops
from enclave_worker.engine.layers.coded_panel import CodedPanelMatmul, try_codes
from enclave_worker.engine.layers.embedding import Embedding
from enclave_worker.engine.layers.linear import Linear, LinearOptions
from enclave_worker.engine.layers.packed import is_zero
from enclave_worker.engine.layers.panel import GEMM_MIN_ROWS, PanelMatmul


def _width() -> int:
    return int(load_cpu_ops().panel_width())


def _gguf_weight(qtype: GGMLQuantizationType, n: int, k: int, seed: int = 0) -> torch.Tensor:
    """A [n, k] fp32 weight as a GGUF checkpoint of this type loads: quantized by gguf, dequantized by gguf."""
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((n, k)) * 0.05).astype(np.float32)
    return torch.from_numpy(gguf.quants.dequantize(gguf.quants.quantize(w, qtype), qtype).copy())


@pytest.mark.parametrize("qtype", [GGMLQuantizationType.Q4_1, GGMLQuantizationType.Q8_0])
@pytest.mark.parametrize("rows", [1, 2, 7, 16, 17, 40, GEMM_MIN_ROWS - 1, GEMM_MIN_ROWS, 300])
@pytest.mark.parametrize("unpack", [False, True])
def test_codes_give_the_fp32_panels_result_to_the_bit(qtype: GGMLQuantizationType, rows: int, unpack: bool) -> None:
    """The same weights, rebuilt exactly, through the same FMAs: equal, not close (every micro-kernel
    height, several row blocks, and prefill-sized calls through the kernel and, ``unpack``, through the
    unpacked GEMM, the rule of the AVX2 / portable kernel, set here on any build)."""
    w = _gguf_weight(qtype, 6 * _width(), 576)
    coded = try_codes(w.clone(), consume=True)
    assert isinstance(coded, CodedPanelMatmul)
    fp32 = PanelMatmul(w.clone(), consume=True)
    if unpack:
        coded.gemm_min_rows = fp32.gemm_min_rows = GEMM_MIN_ROWS
    x = torch.randn(rows, 576, generator=torch.Generator().manual_seed(rows))
    assert torch.equal(coded(x), fp32(x))
    torch.testing.assert_close(coded(x), x @ w.T, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("qtype", [GGMLQuantizationType.Q4_1, GGMLQuantizationType.Q8_0])
def test_unpack_and_row_lookup_rebuild_every_weight_exactly(qtype: GGMLQuantizationType) -> None:
    w = _gguf_weight(qtype, 3 * _width(), 96, seed=1)
    coded = try_codes(w.clone(), consume=False)
    assert coded is not None
    out = torch.empty(96, 3 * _width())
    load_cpu_ops().coded_unpack(coded.codes, coded.scales, coded.offsets, out)
    assert torch.equal(out, w.T)
    ids = torch.tensor([0, 1, _width() - 1, _width(), 3 * _width() - 1, 5, 5])
    assert torch.equal(coded.rows(ids), w[ids])


def test_codes_hold_a_quarter_of_the_bytes_and_zero_an_owned_source() -> None:
    w = _gguf_weight(GGMLQuantizationType.Q4_1, 4 * _width(), 128)
    borrowed = w.clone()
    assert try_codes(borrowed, consume=False) is not None and torch.equal(borrowed, w)  # borrowed: left alone
    owned = w.clone()
    coded = try_codes(owned, consume=True)
    assert coded is not None and is_zero(owned)  # the codes are the one plaintext copy
    held = coded.codes.nbytes + coded.scales.nbytes + coded.offsets.nbytes
    assert held * 16 == w.nbytes * 5  # 1.25 bytes a weight against 4


@pytest.mark.parametrize(
    "spoil",
    [
        "one_ulp",  # one weight nudged off its block's grid: no longer what any code rebuilds
        "nan",
        "inf",
        "fp32",  # a plain fp32 checkpoint: nothing on a grid
        "seventeen_levels",  # an affine block needing 17 levels, beyond 4-bit codes, not symmetric
    ],
)
def test_a_weight_off_the_grid_keeps_fp32_panels_and_its_values(spoil: str) -> None:
    w = _gguf_weight(GGMLQuantizationType.Q4_1, 2 * _width(), 64)
    if spoil == "one_ulp":
        w[_width() + 3, 40] = torch.nextafter(w[_width() + 3, 40], torch.tensor(1.0))
    elif spoil == "nan":
        w[0, 0] = float("nan")
    elif spoil == "inf":
        w[1, 63] = float("inf")
    elif spoil == "fp32":
        w = torch.randn(2 * _width(), 64)
    else:
        w[0, :32] = 0.5 + torch.arange(32) % 17 * 0.0625  # 17 levels a block, all positive
    source = w.clone()
    assert try_codes(source, consume=True) is None
    assert torch.equal(source, w) or (spoil == "nan" and torch.equal(source.nan_to_num(), w.nan_to_num()))
    lin = Linear(source, None, LinearOptions(kernel="panels", codes=True, in_place=True))
    assert type(lin.matmul) is PanelMatmul  # fp32 panels, the same results as before codes existed
    x = torch.randn(3, 64)
    if spoil not in ("nan", "inf"):
        torch.testing.assert_close(lin(x), x @ w.T, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize(("n_mult", "k"), [(1, 48), (2, 31), (1, 0)])
def test_shapes_the_codes_do_not_fit_are_left_to_the_panels(n_mult: int, k: int) -> None:
    """K not a multiple of the code block (or empty): no codes."""
    w = torch.zeros(n_mult * _width(), k)
    assert try_codes(w, consume=False) is None
    assert try_codes(torch.zeros(_width() + 1, 64), consume=False) is None  # N off the panel width
    assert try_codes(torch.zeros(_width(), 64, dtype=torch.float64), consume=False) is None


def test_the_coded_kernels_refuse_mismatched_inputs() -> None:
    ops = load_cpu_ops()
    coded = try_codes(_gguf_weight(GGMLQuantizationType.Q8_0, _width(), 64), consume=False)
    assert coded is not None
    with pytest.raises(RuntimeError, match="disagree on K"):
        ops.coded_linear(torch.randn(2, 32), coded.codes, coded.scales, coded.offsets)
    with pytest.raises(RuntimeError, match="scales, offsets"):
        ops.coded_linear(torch.randn(2, 64), coded.codes, coded.scales[:, :1].contiguous(), coded.offsets)
    with pytest.raises(RuntimeError, match="codes"):
        ops.coded_linear(torch.randn(2, 64), coded.codes.to(torch.int16), coded.scales, coded.offsets)
    with pytest.raises(RuntimeError, match="out"):
        ops.coded_unpack(coded.codes, coded.scales, coded.offsets, torch.empty(64, _width() + 1))
    with pytest.raises(RuntimeError, match="shape"):
        ops.grid_encode(torch.zeros(2 * _width(), 64), coded.codes, coded.scales, coded.offsets)


def test_a_tied_table_in_codes_serves_both_the_lookup_and_the_head() -> None:
    table = _gguf_weight(GGMLQuantizationType.Q8_0, 20 * _width(), 64, seed=2)
    reference = table.clone()
    emb = Embedding(table, LinearOptions(kernel="panels", codes=True, in_place=True), tied=True)
    assert isinstance(emb.head, CodedPanelMatmul) and is_zero(table)
    ids = torch.tensor([0, 1, _width(), 20 * _width() - 1, 7, 7])
    assert torch.equal(emb(ids), reference[ids])
    x = torch.randn(3, 64)
    assert torch.equal(emb.as_lm_head(x), PanelMatmul(reference.clone(), consume=True)(x))


def test_the_default_model_is_coded_throughout_with_the_fp32_panels_greedy_tokens(make_engine, h) -> None:
    """SmolLM2-135M's GGUF holds Q4_1 linears and a Q8_0 table: every one is coded, and greedy
    decoding (batched and alone) matches the fp32 panels' tokens."""
    fp32 = make_engine(panel_codes=False, kv_cache_memory_bytes=16 << 20)
    coded = make_engine(kv_cache_memory_bytes=16 << 20)
    layers = [
        m for layer in coded.model.layers for m in (layer.qkv_proj, layer.o_proj, layer.gate_up_proj, layer.down_proj)
    ]
    assert all(isinstance(m.matmul, CodedPanelMatmul) for m in layers)
    assert isinstance(coded.model.embed.head, CodedPanelMatmul)
    assert not any(isinstance(layer.down_proj.matmul, CodedPanelMatmul) for layer in fp32.model.layers)
    greedy = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
    requests = [(f"r{i}", fp32.tokenizer.encode(p), greedy) for i, p in enumerate(h.prompts[:4])]
    want = {rid: h.tokens_of(o) for rid, o in h.run_sync(fp32, requests).items()}
    assert {rid: h.tokens_of(o) for rid, o in h.run_sync(coded, requests).items()} == want
    assert h.tokens_of(h.run_sync(coded, requests[:1])["r0"]) == want["r0"]


def test_wipe_zeroes_the_codes_scales_and_offsets(make_engine) -> None:
    eng = make_engine(kv_cache_memory_bytes=8 << 20)
    heads = [layer.gate_up_proj.matmul for layer in eng.model.layers] + [eng.model.embed.head]
    parts = [t for m in heads for t in (m.codes, m.scales, m.offsets)]
    held = eng.held_tensors()
    assert all(any(t is p for t in held) for p in parts)
    # every part holds something, but the table's offsets: its Q8_0 blocks are symmetric (m = 0)
    assert not any(is_zero(p) for p in parts if p is not eng.model.embed.head.offsets)
    eng.wipe()
    assert all(is_zero(p) for p in parts)
