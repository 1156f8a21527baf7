"""Prepacked fp32 / bf16 weights (EngineConfig.packed_weights): same math, same greedy tokens, one copy."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from enclave_worker.engine import SamplingParams
from enclave_worker.engine.layers import packed as packed_module
from enclave_worker.engine.layers.linear import Linear
from enclave_worker.engine.layers.packed import (
    PackedMatmul,
    PackingError,
    bf16_native,
    is_zero,
    packing_available,
    zero_every_byte,
)
from enclave_worker.engine.model_builder import PACK_FP32_GAIN

pytestmark = pytest.mark.skipif(not packing_available(), reason="torch built without oneDNN")
needs_bf16 = pytest.mark.skipif(not bf16_native(),
                                reason="oneDNN has no bf16 on this CPU (AVX512BW/VL/DQ or AVX-NE-CONVERT)")


@pytest.mark.parametrize("rows", [1, 3, 64, 130])
@pytest.mark.parametrize("bias", [False, True])
def test_packed_linear_matches_the_reference_at_every_row_count(rows: int, bias: bool) -> None:
    g = torch.Generator().manual_seed(0)
    w, b = torch.randn(192, 64, generator=g), torch.randn(192, generator=g)
    x = torch.randn(rows, 64, generator=g)
    lin = Linear(w, b if bias else None, torch.float32, "cpu", packed=True)
    assert isinstance(lin.matmul, PackedMatmul) and lin.weight.is_mkldnn
    torch.testing.assert_close(lin(x), F.linear(x, w, b if bias else None), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lin(x[None]), F.linear(x, w, b if bias else None)[None], rtol=1e-5, atol=1e-5)


def test_packing_consumes_an_owned_weight_and_leaves_a_borrowed_one() -> None:
    w = torch.randn(128, 64)
    reference = w.clone()
    Linear(w, None, torch.float32, "cpu", packed=True)
    assert torch.equal(w, reference)  # borrowed: untouched
    x = torch.randn(2, 64)
    lin = Linear(w, None, torch.float32, "cpu", in_place=True, packed=True)
    assert is_zero(w)  # handed over: the packed tensor is now the only copy
    torch.testing.assert_close(lin(x), x @ reference.T, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, pytest.param(torch.bfloat16, marks=needs_bf16)])
def test_packed_weight_zeroes_completely(dtype: torch.dtype) -> None:
    lin = Linear(torch.randn(128, 64), None, dtype, "cpu", packed=True)
    assert lin.weight.is_mkldnn
    assert not is_zero(lin.weight)
    zero_every_byte(lin.weight)  # as LLMEngine.wipe does
    assert is_zero(lin.weight)
    assert not lin(torch.randn(1, 64)).any()


def test_bf16_without_cpu_support_keeps_the_plain_kernels_and_its_source(monkeypatch) -> None:
    """On a CPU where oneDNN has no bf16 (AVX2 only), packing is refused before anything is copied: torch
    raised a RuntimeError mid-build there, and an engine asked for packed bf16 failed to build."""
    monkeypatch.setattr(packed_module, "bf16_native", lambda: False)
    w = torch.randn(128, 64)
    with pytest.raises(PackingError):
        PackedMatmul(w.bfloat16(), consume=True)
    source = w.clone()
    lin = Linear(source, None, torch.bfloat16, "cpu", in_place=True, packed=True)
    assert not isinstance(lin.matmul, PackedMatmul) and not lin.weight.is_mkldnn
    x = torch.randn(2, 64).bfloat16()
    torch.testing.assert_close(lin(x), F.linear(x, w.bfloat16()), rtol=2e-2, atol=2e-2)


def test_fp16_weights_keep_the_plain_kernels() -> None:
    lin = Linear(torch.randn(32, 16), None, torch.float16, "cpu", packed=True)
    assert not isinstance(lin.matmul, PackedMatmul) and not lin.weight.is_mkldnn


@needs_bf16
@pytest.mark.parametrize("rows", [1, 5, 64])
def test_bf16_packed_linear_matches_bf16_math_and_consumes_its_fp32_source(rows: int) -> None:
    g = torch.Generator().manual_seed(1)
    w, b, x = torch.randn(128, 64, generator=g), torch.randn(128, generator=g), torch.randn(rows, 64, generator=g)
    reference = F.linear(x.bfloat16(), w.bfloat16(), b.bfloat16())
    source = w.clone()
    lin = Linear(source, b, torch.bfloat16, "cpu", in_place=True, packed=True)
    assert isinstance(lin.matmul, PackedMatmul) and lin.weight.is_mkldnn and lin.weight.dtype == torch.bfloat16
    assert is_zero(source)  # the fp32 original was handed over: the packed bf16 tensor is the only copy
    torch.testing.assert_close(lin(x.bfloat16()), reference, rtol=2e-2, atol=2e-2)
    y = lin(x)  # an fp32 input is converted and answered in fp32
    assert y.dtype == torch.float32
    torch.testing.assert_close(y, reference.float(), rtol=2e-2, atol=2e-2)


def _padded_bf16_shape() -> tuple[int, int] | None:
    """A weight shape whose packed bf16 layout oneDNN pads on this CPU: which ones it pads depends on
    the kernels it picks (a Zen 4 padded 96 x 64; an Intel CPU with AMX did not, but padded 100 x 64
    and 96 x 100)."""
    from enclave_worker.engine.layers.packed import PACK_ROWS

    with torch.inference_mode():
        for shape in ((96, 64), (100, 64), (130, 64), (96, 100)):
            probe = torch.ops.mkldnn._reorder_linear_weight(torch.zeros(shape, dtype=torch.bfloat16), PACK_ROWS)
            if torch.ops.mkldnn._nbytes(probe) != probe.numel() * probe.element_size():
                return shape
    return None


@needs_bf16
def test_a_padded_bf16_layout_is_refused_before_the_weight_is_copied_into_it() -> None:
    """oneDNN pads some bf16 matrices: the layer keeps torch's kernel, and its weight is intact."""
    shape = _padded_bf16_shape()
    if shape is None:
        pytest.skip("oneDNN pads none of the candidate bf16 shapes on this CPU")
    w = torch.randn(*shape)
    lin = Linear(w, None, torch.bfloat16, "cpu", in_place=True, packed=True)
    assert not isinstance(lin.matmul, PackedMatmul) and not lin.weight.is_mkldnn
    x = torch.randn(3, shape[1]).bfloat16()
    torch.testing.assert_close(lin(x), F.linear(x, w.bfloat16()), rtol=2e-2, atol=2e-2)


def test_bf16_defaults_to_packed_only_where_the_cpu_has_bf16_instructions(make_engine) -> None:
    from enclave_worker.engine.layers.packed import bf16_native

    eng = make_engine(dtype="bfloat16", kv_cache_memory_bytes=8 << 20)
    assert eng.model.layers[0].gate_up_proj.weight.is_mkldnn == bf16_native()
    off = make_engine(dtype="bfloat16", packed_weights=False, kv_cache_memory_bytes=8 << 20)
    assert not off.model.layers[0].gate_up_proj.weight.is_mkldnn


@pytest.mark.parametrize(("gain", "packed"), [(PACK_FP32_GAIN, True), (PACK_FP32_GAIN * 0.99, False)])
def test_fp32_defaults_to_packed_where_onednn_measured_faster(make_engine, monkeypatch, gain, packed) -> None:
    """The fp32 default follows the measured gain of oneDNN over OpenBLAS and torch (blas_calibration.py);
    an explicit setting wins over the measurement."""
    from enclave_worker.engine import model_builder

    asked = []
    monkeypatch.setattr(model_builder, "measure_packed_speedup", lambda *shape: asked.append(shape) or gain)
    eng = make_engine(kv_cache_memory_bytes=8 << 20)
    assert eng.model.layers[0].gate_up_proj.weight.is_mkldnn == packed
    assert isinstance(eng.model.embed.head, PackedMatmul) == packed  # the tied head with the layers
    assert len(asked) == 1  # measured once, on the MLP's shape
    asked.clear()
    forced = make_engine(packed_weights=not packed, kv_cache_memory_bytes=8 << 20)
    assert forced.model.layers[0].gate_up_proj.weight.is_mkldnn == (not packed) and not asked


def test_fp32_stays_plain_where_the_gain_cannot_be_measured(make_engine, monkeypatch) -> None:
    from enclave_worker.engine import model_builder

    def refuse(*shape: int) -> float:
        raise PackingError("no oneDNN here")

    monkeypatch.setattr(model_builder, "measure_packed_speedup", refuse)
    assert not make_engine(kv_cache_memory_bytes=8 << 20).model.layers[0].gate_up_proj.weight.is_mkldnn


@needs_bf16
def test_bf16_packed_engine_agrees_with_the_plain_bf16_engine(make_engine, h) -> None:
    """Same model in bf16, packed (oneDNN) and plain (torch): the tied head is packed too, and the
    logits of a teacher-forced pass agree within bf16 rounding."""
    from tests.enclave_worker.engine.perplexity import perplexity

    plain = make_engine(dtype="bfloat16", packed_weights=False, kv_cache_memory_bytes=16 << 20)
    packed = make_engine(dtype="bfloat16", packed_weights=True, kv_cache_memory_bytes=16 << 20)
    assert packed.model.embed.head.packed.is_mkldnn and packed.model.lm_head is None
    assert not packed.model.embed.weight.is_mkldnn  # rows for the lookup stay plain
    text = plain.tokenizer.encode(h.prompts[0] + " " + h.prompts[1])
    p_plain, p_packed = perplexity(plain, text), perplexity(packed, text)
    assert abs(p_packed - p_plain) / p_plain < 0.01, (p_packed, p_plain)
    greedy = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    out = h.run_sync(packed, [("r", packed.tokenizer.encode("The capital of France is"), greedy)])["r"]
    assert "Paris" in "".join(o.delta_text for o in out)


def test_packed_engine_gives_the_plain_engines_greedy_tokens(make_engine, h) -> None:
    plain = make_engine(packed_weights=False, kv_cache_memory_bytes=16 << 20)
    packed = make_engine(packed_weights=True, kv_cache_memory_bytes=16 << 20)
    assert all(isinstance(layer.gate_up_proj.matmul, PackedMatmul) for layer in packed.model.layers)
    assert isinstance(packed.model.embed.head, PackedMatmul) and not packed.model.embed.weight.is_mkldnn
    assert not any(isinstance(layer.gate_up_proj.matmul, PackedMatmul) for layer in plain.model.layers)
    greedy = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
    requests = [(f"r{i}", plain.tokenizer.encode(p), greedy) for i, p in enumerate(h.prompts[:4])]
    want = {rid: h.tokens_of(o) for rid, o in h.run_sync(plain, requests).items()}
    got = {rid: h.tokens_of(o) for rid, o in h.run_sync(packed, requests).items()}  # batched: 4-row GEMMs
    assert got == want
    alone = h.run_sync(packed, requests[:1])["r0"]  # one row
    assert h.tokens_of(alone) == want["r0"]


def test_packed_engine_builds_from_the_checkpoint_in_place(checkpoint) -> None:
    """The source of a packed weight is zeroed (for a package: its region of the decrypted buffer)."""
    import dataclasses

    from enclave_worker.engine import EngineConfig, LLMEngine

    tensors = {k: v.clone() for k, v in checkpoint.tensors.items()}
    source = tensors["model.layers.0.mlp.down_proj.weight"]
    original = checkpoint.tensors["model.layers.0.mlp.down_proj.weight"]
    eng = LLMEngine.from_checkpoint(
        dataclasses.replace(checkpoint, tensors=tensors),
        EngineConfig(packed_weights=True, num_threads=1, max_num_seqs=4, kv_cache_memory_bytes=8 << 20),
    )
    assert is_zero(source)
    x = torch.randn(2, original.shape[1])
    torch.testing.assert_close(eng.model.layers[0].down_proj(x), F.linear(x, original), rtol=1e-4, atol=1e-4)
