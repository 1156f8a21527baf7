"""fp32 weights in column panels (EngineConfig.panel_weights, layers/panel.py, kernels/cpu_linear.cpp):
same math at every row count, one copy in the source's own memory, the same greedy tokens as the
checkpoint's layout, and wiped with the rest."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from enclave_worker.engine import SamplingParams
from enclave_worker.engine.kernels.cpu_ops import load_cpu_ops
from enclave_worker.engine.layers.embedding import Embedding
from enclave_worker.engine.layers.linear import DenseMatmul, Linear
from enclave_worker.engine.layers.packed import is_zero
from enclave_worker.engine.layers.panel import PanelMatmul, try_panel


def _width() -> int:
    return int(load_cpu_ops().panel_width())


@pytest.mark.parametrize("rows", [1, 3, 16, 17, 40, 300])
@pytest.mark.parametrize("bias", [False, True])
def test_panel_linear_matches_the_reference_at_every_row_count(rows: int, bias: bool) -> None:
    """Every micro-kernel height (1 .. MR rows, a remainder, several row blocks) against F.linear."""
    g = torch.Generator().manual_seed(0)
    w, b = torch.randn(12 * _width(), 576, generator=g), torch.randn(12 * _width(), generator=g)
    x = torch.randn(rows, 576, generator=g)
    lin = Linear(w, b if bias else None, torch.float32, "cpu", panel=True)
    assert isinstance(lin.matmul, PanelMatmul)
    want = F.linear(x, w, b if bias else None)
    torch.testing.assert_close(lin(x), want, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(lin(x[None]), want[None], rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(lin(x.t().contiguous().t()), want, rtol=1e-5, atol=1e-4)  # a strided input


def test_panels_take_an_owned_weights_memory_and_leave_a_borrowed_one() -> None:
    w = torch.randn(4 * _width(), 64)
    reference = w.clone()
    borrowed = Linear(w, None, torch.float32, "cpu", panel=True)
    assert torch.equal(w, reference) and borrowed.weight.data_ptr() != w.data_ptr()
    owned = Linear(w, None, torch.float32, "cpu", in_place=True, panel=True)
    assert owned.weight.data_ptr() == w.data_ptr()  # the panels are the source's memory: one copy
    assert not torch.equal(w, reference)  # ... rearranged, not duplicated
    x = torch.randn(5, 64)
    torch.testing.assert_close(owned(x), x @ reference.T, rtol=1e-5, atol=1e-5)


def test_weights_that_do_not_fit_a_panel_keep_the_checkpoint_layout() -> None:
    assert try_panel(torch.randn(_width() + 1, 8), consume=False) is None  # outputs not a multiple of NR
    assert try_panel(torch.randn(_width(), 8).bfloat16(), consume=False) is None
    lin = Linear(torch.randn(_width() + 1, 8), None, torch.float32, "cpu", panel=True)
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
    emb = Embedding(table, "none", torch.float32, "cpu", in_place=True, panel=True)
    assert isinstance(emb.head, PanelMatmul) and emb.weight.data_ptr() == table.data_ptr()  # held once
    ids = torch.tensor([0, 1, _width() - 1, _width(), 50 * _width() - 1, 7, 7])
    assert torch.equal(emb(ids), reference[ids])
    x = torch.randn(3, 64)
    torch.testing.assert_close(emb.as_lm_head(x), x @ reference.T, rtol=1e-5, atol=1e-4)


def test_panel_engine_gives_the_plain_engines_greedy_tokens(make_engine, h) -> None:
    plain = make_engine(panel_weights=False, kv_cache_memory_bytes=16 << 20)
    panel = make_engine(panel_weights=True, kv_cache_memory_bytes=16 << 20)  # opt-in until measured quiet
    assert all(isinstance(layer.gate_up_proj.matmul, PanelMatmul) for layer in panel.model.layers)
    assert isinstance(panel.model.embed.head, PanelMatmul) and panel.runner.panel_weights
    assert panel.runner.weight_bytes == 0  # no step goes to OpenBLAS
    assert not any(isinstance(layer.gate_up_proj.matmul, PanelMatmul) for layer in plain.model.layers)
    greedy = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
    requests = [(f"r{i}", plain.tokenizer.encode(p), greedy) for i, p in enumerate(h.prompts[:4])]
    want = {rid: h.tokens_of(o) for rid, o in h.run_sync(plain, requests).items()}
    got = {rid: h.tokens_of(o) for rid, o in h.run_sync(panel, requests).items()}  # batched: 4-row steps
    assert got == want
    alone = h.run_sync(panel, requests[:1])["r0"]  # one row
    assert h.tokens_of(alone) == want["r0"]


def test_torch_decode_kernels_keep_the_checkpoint_layout(make_engine) -> None:
    """Panels need the C++ kernels: under decode_kernels="torch" the layers stay plain (and on OpenBLAS)."""
    eng = make_engine(decode_kernels="torch", panel_weights=True, kv_cache_memory_bytes=8 << 20)
    assert not eng.runner.panel_weights
    assert not any(isinstance(layer.qkv_proj.matmul, PanelMatmul) for layer in eng.model.layers)


def test_wipe_zeroes_the_panels(make_engine) -> None:
    eng = make_engine(panel_weights=True, kv_cache_memory_bytes=8 << 20)
    panels = [layer.down_proj.matmul.panels for layer in eng.model.layers] + [eng.model.embed.head.panels]
    held = eng.held_tensors()
    assert all(any(t is p for t in held) for p in panels)
    assert not any(is_zero(p) for p in panels)
    eng.wipe()
    assert all(is_zero(p) for p in panels)


def test_panels_are_opt_in(make_engine) -> None:
    """Off by default (EngineConfig.panel_weights None) until a quiet machine shows them faster end to end."""
    eng = make_engine(kv_cache_memory_bytes=8 << 20)
    assert not eng.runner.panel_weights
    assert not any(isinstance(layer.qkv_proj.matmul, PanelMatmul) for layer in eng.model.layers)
