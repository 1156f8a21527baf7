"""fp32 weights in column panels (the fp32 CPU path, layers/panel.py, kernels/cpu_linear.cpp):
same math at every row count, one copy in the source's own memory, the same greedy tokens as the
reference path (torch's F.linear), and wiped with the rest."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from enclave_worker.engine import SamplingParams
from enclave_worker.engine.kernels.cpu_ops import load_cpu_ops
from enclave_worker.engine.layers.embedding import Embedding
from enclave_worker.engine.layers.linear import DenseMatmul, Linear, LinearOptions
from enclave_worker.engine.layers.packed import is_zero
from enclave_worker.engine.layers.panel import GEMM_MIN_ROWS, PanelMatmul, UnpackScratch, gemm_min_rows, try_panel

PANELS = LinearOptions(kernel="panels")


def _width() -> int:
    return int(load_cpu_ops().panel_width())


@pytest.mark.parametrize("rows", [1, 3, 16, 17, 40, GEMM_MIN_ROWS - 1, GEMM_MIN_ROWS, 300])
@pytest.mark.parametrize("bias", [False, True])
def test_panel_linear_matches_the_reference_at_every_row_count(rows: int, bias: bool) -> None:
    """Every micro-kernel height (1 .. MR rows, a remainder, several row blocks) against F.linear."""
    g = torch.Generator().manual_seed(0)
    w, b = torch.randn(12 * _width(), 576, generator=g), torch.randn(12 * _width(), generator=g)
    x = torch.randn(rows, 576, generator=g)
    lin = Linear(w, b if bias else None, PANELS)
    assert isinstance(lin.matmul, PanelMatmul)
    want = F.linear(x, w, b if bias else None)
    torch.testing.assert_close(lin(x), want, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(lin(x[None]), want[None], rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(lin(x.t().contiguous().t()), want, rtol=1e-5, atol=1e-4)  # a strided input


def test_panels_take_an_owned_weights_memory_and_leave_a_borrowed_one() -> None:
    w = torch.randn(4 * _width(), 64)
    reference = w.clone()
    borrowed = Linear(w, None, PANELS)
    assert torch.equal(w, reference) and borrowed.weight.data_ptr() != w.data_ptr()
    owned = Linear(w, None, LinearOptions(kernel="panels", in_place=True))
    assert owned.weight.data_ptr() == w.data_ptr()  # the panels are the source's memory: one copy
    assert not torch.equal(w, reference)  # ... rearranged, not duplicated
    x = torch.randn(5, 64)
    torch.testing.assert_close(owned(x), x @ reference.T, rtol=1e-5, atol=1e-5)


def test_a_prefill_unpacks_the_layer_for_the_call_and_zeroes_that_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the rule unpacks (the AVX2 / portable kernel, set here on any build), from GEMM_MIN_ROWS rows
    the layer goes through torch's GEMM on W^T unpacked for the call; the unpacked copy is plaintext
    weights, so it is zeroed before the allocator gets it back, also when the GEMM fails."""
    w = torch.randn(3 * _width(), 48)
    pm = PanelMatmul(w.clone(), consume=False)
    pm.gemm_min_rows = GEMM_MIN_ROWS
    seen: list[torch.Tensor] = []
    real_mm = torch.mm

    def spy(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        seen.append(b)
        torch.testing.assert_close(b, w.T)  # the unpacked layer is W^T exactly
        return real_mm(a, b)

    monkeypatch.setattr(torch, "mm", spy)
    x = torch.randn(GEMM_MIN_ROWS, 48)
    torch.testing.assert_close(pm(x), x @ w.T, rtol=1e-5, atol=1e-4)
    assert len(seen) == 1 and not seen[0].any()  # used once, then zeroed
    pm(x[: GEMM_MIN_ROWS - 1])
    assert len(seen) == 1  # a decode-sized call stays on the panel kernel

    def failing(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        seen.append(b)
        raise RuntimeError("out of memory")

    monkeypatch.setattr(torch, "mm", failing)
    with pytest.raises(RuntimeError, match="out of memory"):
        pm(x)
    assert not seen[-1].any()


def test_the_rule_for_prefill_sized_calls_follows_the_kernels_width() -> None:
    """The AVX-512 kernel (16 outputs a panel) takes every call; the AVX2 / portable one (8) hands calls
    of GEMM_MIN_ROWS+ rows to the unpacked GEMM. A layer carries its build's rule."""
    assert gemm_min_rows(16) is None
    assert gemm_min_rows(8) == GEMM_MIN_ROWS
    assert PanelMatmul(torch.randn(2 * _width(), 32), consume=False).gemm_min_rows == gemm_min_rows(_width())


@pytest.mark.parametrize("rows", [GEMM_MIN_ROWS, 300])
def test_where_the_kernel_takes_a_prefill_each_rows_result_is_the_rows_own(rows: int) -> None:
    """Over the AVX-512 kernel a prefill-sized call computes each row as a call of that row alone would,
    to the bit: a prompt's logits do not depend on the prompts or decodes in its step."""
    if gemm_min_rows(_width()) is not None:
        pytest.skip("this build's kernel hands prefill-sized calls to torch's GEMM (AVX2 / portable)")
    g = torch.Generator().manual_seed(rows)
    pm = PanelMatmul(torch.randn(6 * _width(), 576, generator=g), consume=False)
    x = torch.randn(rows, 576, generator=g)
    together = pm(x)
    for i in (0, 1, 13, rows // 2, rows - 1):
        assert torch.equal(together[i], pm(x[i : i + 1])[0])
    assert torch.equal(together[rows - 20 :], pm(x[rows - 20 :]))  # a decode-sized call of the last rows


@pytest.mark.parametrize(("panels", "k"), [(1, 1), (3, 37), (5, 16), (2, 200)])
def test_the_unpack_kernel_writes_w_transposed_exactly(panels: int, k: int) -> None:
    """Row counts around the kernel's blocks of 16 (1, 37, 16, 200), one panel and several."""
    w = torch.randn(panels * _width(), k)
    out = torch.full((k, panels * _width()), float("nan"))
    load_cpu_ops().panel_unpack(PanelMatmul(w.clone(), consume=False).panels, out)
    assert torch.equal(out, w.T)


def test_the_unpack_kernel_refuses_an_output_of_another_shape_or_type() -> None:
    # K = 40: no multiple of a panel width (8 or 16), so a transposed shape is never the right one by chance
    pm = PanelMatmul(torch.randn(2 * _width(), 40), consume=False)
    for bad in (
        torch.empty(40, _width()),
        torch.empty(2 * _width(), 40),
        torch.empty(40, 2 * _width()).double(),
        torch.empty(2 * _width(), 40).T,
    ):
        with pytest.raises(RuntimeError, match=r"out \[K, N\]"):
            load_cpu_ops().panel_unpack(pm.panels, bad)


def test_a_prefill_with_the_models_scratch_unpacks_there_and_keeps_no_transient_copy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With the model's UnpackScratch the layer is unpacked into that one buffer (a held tensor the
    wipe zeroes), reused by every layer and grown for a larger one; the smaller buffer it replaces is
    zeroed first. A layer above the scratch's size takes a transient buffer, zeroed after the call."""
    scratch = UnpackScratch(max_bytes=4 * 3 * _width() * 48)
    small = PanelMatmul(torch.randn(2 * _width(), 48), consume=False, scratch=scratch)
    w = torch.randn(3 * _width(), 48)
    large = PanelMatmul(w.clone(), consume=False, scratch=scratch)
    small.gemm_min_rows = large.gemm_min_rows = GEMM_MIN_ROWS  # the unpacking rule, on any build
    x = torch.randn(GEMM_MIN_ROWS, 48)
    small(x)
    first = scratch.buffer
    assert first.numel() == 2 * _width() * 48 and first.any()
    torch.testing.assert_close(large(x), x @ w.T, rtol=1e-5, atol=1e-4)
    assert not first.any()  # replaced by a larger buffer: zeroed before it went back to the allocator
    assert torch.equal(scratch.buffer.view(48, -1), w.T)  # the last layer's W^T, until the wipe
    seen: list[torch.Tensor] = []
    real_mm = torch.mm
    monkeypatch.setattr(torch, "mm", lambda a, b: seen.append(b) or real_mm(a, b))
    too_big = PanelMatmul(torch.randn(4 * _width(), 48), consume=False, scratch=scratch)
    too_big.gemm_min_rows = GEMM_MIN_ROWS
    too_big(x)
    assert seen[-1].data_ptr() != scratch.buffer.data_ptr() and not seen[-1].any()  # its own, zeroed


def test_the_engines_unpack_scratch_is_held_and_wiped(make_engine, h) -> None:
    """Where the build's rule unpacks, a prefill leaves the last layer's W^T in the scratch until the wipe;
    where it never does (the AVX-512 kernel), no plaintext copy is ever made there."""
    eng = make_engine(kv_cache_memory_bytes=16 << 20)
    prompt = eng.tokenizer.encode(" ".join(h.prompts) * 3)
    assert len(prompt) >= GEMM_MIN_ROWS  # one prefill-sized step through every layer
    h.run_sync(eng, [("r", prompt, SamplingParams(max_tokens=2, temperature=0, ignore_eos=True))])
    scratch = eng.model.unpack_scratch.buffer
    if gemm_min_rows(_width()) is None:
        assert scratch.numel() == 0
        return
    assert scratch.numel() > 0 and scratch.any()
    assert any(t is scratch for t in eng.held_tensors())
    eng.wipe()
    assert is_zero(scratch)


def test_a_long_prefill_over_panels_gives_the_reference_engines_greedy_tokens(make_engine, h) -> None:
    plain = make_engine(decode_kernels="torch", kv_cache_memory_bytes=16 << 20)
    panel = make_engine(kv_cache_memory_bytes=16 << 20)
    prompt = plain.tokenizer.encode(" ".join(h.prompts) * 3)
    assert len(prompt) >= GEMM_MIN_ROWS
    greedy = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    want = h.tokens_of(h.run_sync(plain, [("r", prompt, greedy)])["r"])
    assert h.tokens_of(h.run_sync(panel, [("r", prompt, greedy)])["r"]) == want


def test_a_long_prompts_logprobs_are_the_same_alone_and_prefilled_beside_another(make_engine, h) -> None:
    """Over the AVX-512 kernel a prefill step's rows are computed each on its own: a 128+ token prompt
    gives the same logprobs, to the bit, alone and sharing its prefill step with another long prompt."""
    if gemm_min_rows(_width()) is not None:
        pytest.skip("this build's kernel hands prefill-sized calls to torch's GEMM (AVX2 / portable)")
    eng = make_engine(num_threads=2, kv_cache_memory_bytes=64 << 20, enable_prefix_caching=False)
    prompt = eng.tokenizer.encode(" ".join(h.prompts) * 3)
    other = eng.tokenizer.encode(" ".join(reversed(h.prompts)) * 3)
    assert len(prompt) >= GEMM_MIN_ROWS and len(other) >= GEMM_MIN_ROWS
    params = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True, logprobs=3)

    def logprobs(outs: list) -> list:
        return [(t.token_id, t.logprob, t.top) for o in outs for t in o.logprobs]

    alone = logprobs(h.run_sync(eng, [("a", prompt, params)])["a"])
    together = h.run_sync(eng, [("o", other, params), ("b", prompt, params)])
    assert logprobs(together["b"]) == alone
    assert logprobs(together["o"]) != alone  # real, distinct rows


def test_weights_that_do_not_fit_a_panel_keep_the_checkpoint_layout() -> None:
    assert try_panel(torch.randn(_width() + 1, 8), consume=False) is None  # outputs not a multiple of NR
    assert try_panel(torch.randn(_width(), 8).bfloat16(), consume=False) is None
    lin = Linear(torch.randn(_width() + 1, 8), None, PANELS)
    assert isinstance(lin.matmul, DenseMatmul)


def test_the_kernel_refuses_mismatched_shapes() -> None:
    pm = PanelMatmul(torch.randn(2 * _width(), 32), consume=False)
    with pytest.raises(RuntimeError, match="disagree on K"):
        load_cpu_ops().panel_linear(torch.randn(3, 31), pm.panels)
    with pytest.raises(RuntimeError, match="float32"):
        load_cpu_ops().panel_linear(torch.randn(3, 32).double(), pm.panels)
    with pytest.raises(RuntimeError, match="panels"):
        load_cpu_ops().panel_linear(torch.randn(3, 32), pm.panels.view(-1, 32))


def test_a_tied_table_in_panels_serves_both_the_lookup_and_the_head() -> None:
    table = torch.randn(50 * _width(), 64)
    reference = table.clone()
    emb = Embedding(table, LinearOptions(kernel="panels", in_place=True), tied=True)
    assert isinstance(emb.head, PanelMatmul) and emb.weight.data_ptr() == table.data_ptr()  # held once
    ids = torch.tensor([0, 1, _width() - 1, _width(), 50 * _width() - 1, 7, 7])
    assert torch.equal(emb(ids), reference[ids])
    x = torch.randn(3, 64)
    torch.testing.assert_close(emb.as_lm_head(x), x @ reference.T, rtol=1e-5, atol=1e-4)


def test_panel_engine_gives_the_reference_engines_greedy_tokens(make_engine, h) -> None:
    plain = make_engine(decode_kernels="torch", kv_cache_memory_bytes=16 << 20)
    panel = make_engine(kv_cache_memory_bytes=16 << 20)
    assert all(isinstance(layer.gate_up_proj.matmul, PanelMatmul) for layer in panel.model.layers)
    assert isinstance(panel.model.embed.head, PanelMatmul) and panel.kernel_path.linear == "panels"
    assert not any(isinstance(layer.gate_up_proj.matmul, PanelMatmul) for layer in plain.model.layers)
    greedy = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
    requests = [(f"r{i}", plain.tokenizer.encode(p), greedy) for i, p in enumerate(h.prompts[:4])]
    want = {rid: h.tokens_of(o) for rid, o in h.run_sync(plain, requests).items()}
    got = {rid: h.tokens_of(o) for rid, o in h.run_sync(panel, requests).items()}  # batched: 4-row steps
    assert got == want
    alone = h.run_sync(panel, requests[:1])["r0"]  # one row
    assert h.tokens_of(alone) == want["r0"]


def test_torch_decode_kernels_keep_the_checkpoint_layout(make_engine) -> None:
    """Panels need the C++ kernels: under decode_kernels="torch" the layers stay on torch's F.linear."""
    eng = make_engine(decode_kernels="torch", kv_cache_memory_bytes=8 << 20)
    assert eng.kernel_path.linear == "torch" and not eng.kernel_path.cpu_kernels
    assert not any(isinstance(layer.qkv_proj.matmul, PanelMatmul) for layer in eng.model.layers)


def test_wipe_zeroes_the_panels(make_engine) -> None:
    eng = make_engine(kv_cache_memory_bytes=8 << 20)
    panels = [layer.down_proj.matmul.panels for layer in eng.model.layers] + [eng.model.embed.head.panels]
    held = eng.held_tensors()
    assert all(any(t is p for t in held) for p in panels)
    assert not any(is_zero(p) for p in panels)
    eng.wipe()
    assert all(is_zero(p) for p in panels)


def test_panels_are_the_fp32_cpu_path(make_engine) -> None:
    eng = make_engine(kv_cache_memory_bytes=8 << 20)
    assert eng.kernel_path.linear == "panels" and eng.kernel_path.cpu_kernels
    assert all(isinstance(layer.qkv_proj.matmul, PanelMatmul) for layer in eng.model.layers)
