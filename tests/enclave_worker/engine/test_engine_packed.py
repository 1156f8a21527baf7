"""Prepacked bf16 weights (the bf16 path on CPU class x86-avx512-bf16, layers/packed.py): same math, one
copy, wiped completely; every other dtype keeps torch's kernel."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from enclave_worker.engine import SamplingParams
from enclave_worker.engine.layers import packed as packed_module
from enclave_worker.engine.layers.linear import Linear, LinearOptions
from enclave_worker.engine.layers.packed import (
    PackedMatmul,
    PackingError,
    bf16_native,
    is_zero,
    packing_available,
    zero_every_byte,
)

pytestmark = pytest.mark.skipif(not packing_available(), reason="torch built without oneDNN")
needs_bf16 = pytest.mark.skipif(not bf16_native(),
                                reason="oneDNN has no bf16 on this CPU (AVX512BW/VL/DQ or AVX-NE-CONVERT)")


def packed(dtype: torch.dtype = torch.bfloat16, in_place: bool = False) -> LinearOptions:
    return LinearOptions(dtype=dtype, kernel="onednn-packed", in_place=in_place)


@needs_bf16
def test_packed_weight_zeroes_completely() -> None:
    lin = Linear(torch.randn(128, 64), None, packed())
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
    lin = Linear(source, None, packed(in_place=True))
    assert not isinstance(lin.matmul, PackedMatmul) and not lin.weight.is_mkldnn
    x = torch.randn(2, 64).bfloat16()
    torch.testing.assert_close(lin(x), F.linear(x, w.bfloat16()), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_other_dtypes_are_never_packed(dtype: torch.dtype) -> None:
    lin = Linear(torch.randn(32, 16), None, packed(dtype))
    assert not isinstance(lin.matmul, PackedMatmul) and not lin.weight.is_mkldnn
    with pytest.raises(PackingError):
        PackedMatmul(torch.randn(32, 16, dtype=dtype), consume=False)


@needs_bf16
@pytest.mark.parametrize("rows", [1, 5, 64])
def test_bf16_packed_linear_matches_bf16_math_and_consumes_its_fp32_source(rows: int) -> None:
    g = torch.Generator().manual_seed(1)
    w, b, x = torch.randn(128, 64, generator=g), torch.randn(128, generator=g), torch.randn(rows, 64, generator=g)
    reference = F.linear(x.bfloat16(), w.bfloat16(), b.bfloat16())
    source = w.clone()
    lin = Linear(source, b, packed(in_place=True))
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
    lin = Linear(w, None, packed(in_place=True))
    assert not isinstance(lin.matmul, PackedMatmul) and not lin.weight.is_mkldnn
    x = torch.randn(3, shape[1]).bfloat16()
    torch.testing.assert_close(lin(x), F.linear(x, w.bfloat16()), rtol=2e-2, atol=2e-2)


def test_bf16_is_packed_only_where_the_cpu_has_bf16_instructions(make_engine) -> None:
    eng = make_engine(dtype="bfloat16", kv_cache_memory_bytes=8 << 20)
    assert eng.model.layers[0].gate_up_proj.weight.is_mkldnn == bf16_native()
    assert (eng.kernel_path.linear == "onednn-packed") == bf16_native()
    reference = make_engine(dtype="bfloat16", decode_kernels="torch", kv_cache_memory_bytes=8 << 20)
    assert not reference.model.layers[0].gate_up_proj.weight.is_mkldnn


@needs_bf16
def test_bf16_packed_engine_agrees_with_the_plain_bf16_engine(make_engine, h) -> None:
    """Same model in bf16, packed (oneDNN, the bf16 path) and the torch reference path (torch's linears
    and attention): the tied head is packed too, and a teacher-forced pass agrees within bf16 rounding
    (each path is within 1% of fp32: test_engine_quant.py; the two within 2% of each other)."""
    from tests.enclave_worker.engine.perplexity import perplexity

    plain = make_engine(dtype="bfloat16", decode_kernels="torch", kv_cache_memory_bytes=16 << 20)
    packed = make_engine(dtype="bfloat16", kv_cache_memory_bytes=16 << 20)
    assert packed.model.embed.head.packed.is_mkldnn and packed.model.lm_head is None
    assert not packed.model.embed.weight.is_mkldnn  # rows for the lookup stay plain
    text = plain.tokenizer.encode(h.prompts[0] + " " + h.prompts[1])
    p_plain, p_packed = perplexity(plain, text), perplexity(packed, text)
    assert abs(p_packed - p_plain) / p_plain < 0.02, (p_packed, p_plain)
    greedy = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    out = h.run_sync(packed, [("r", packed.tokenizer.encode("The capital of France is"), greedy)])["r"]
    assert "Paris" in "".join(o.delta_text for o in out)


@needs_bf16
def test_packed_engine_builds_from_the_checkpoint_in_place(checkpoint) -> None:
    """The source of a packed weight is zeroed (for a package: its region of the decrypted buffer)."""
    import dataclasses

    from enclave_worker.engine import EngineConfig, LLMEngine

    tensors = {k: v.clone() for k, v in checkpoint.tensors.items()}
    source = tensors["model.layers.0.mlp.down_proj.weight"]
    original = checkpoint.tensors["model.layers.0.mlp.down_proj.weight"]
    eng = LLMEngine.from_checkpoint(
        dataclasses.replace(checkpoint, tensors=tensors),
        EngineConfig(dtype="bfloat16", num_threads=1, max_num_seqs=4, kv_cache_memory_bytes=8 << 20),
    )
    assert is_zero(source)
    x = torch.randn(2, original.shape[1])
    want = F.linear(x.bfloat16(), original.bfloat16()).float()
    torch.testing.assert_close(eng.model.layers[0].down_proj(x), want, rtol=2e-2, atol=2e-2)
