"""The CPU's int8 x int8 block kernel (layers/q8_blocks.py, kernels/cpu_q8.cpp): int8 weights in blocks
of 32 with an fp32 scale each, activations quantized per row and block of 32, exact integer block dots.

The reference is computed here from the same codes and the same quantized activations, the block dots
in int64 and the sum in float64: the kernel may differ from it only by its fp32 rounding."""

from __future__ import annotations

import pytest
import torch

from enclave_worker.engine.layers.q8_blocks import (
    Q8BlockMatmul,
    channel_scales_to_blocks,
    quantize_activations,
    quantize_blocks,
)
from enclave_worker.engine.layers.quantized_weight import QuantizedWeight, QuantSpec, dequantize


def weights(n: int, k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random codes over the whole int8 range (-128 included: no tier may saturate on it), block scales."""
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(-128, 128, (n, k), generator=g, dtype=torch.int8)
    scales = torch.rand(n, (k + 31) // 32, generator=g) * 1e-2
    return codes, scales


def reference(x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """y [M, N] in float64 from the kernel's own quantized activations, block dots exact in int64."""
    n, k = codes.shape
    kp = scales.shape[1] * 32
    xq, xs = quantize_activations(x)
    w = torch.nn.functional.pad(codes, (0, kp - k)).long().view(n, kp // 32, 32)
    dots = torch.einsum("mbk,nbk->mnb", xq.long().view(-1, kp // 32, 32), w).double()
    return (dots * xs.double()[:, None, :] * scales.double()[None]).sum(-1)


def bound(x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """fp32 rounding of a sum of kb terms: a few ulps of the sum of their magnitudes, per output."""
    n, k = codes.shape
    xq, xs = quantize_activations(x)
    kp = scales.shape[1] * 32
    w = torch.nn.functional.pad(codes, (0, kp - k)).long().abs().view(n, kp // 32, 32)
    mags = torch.einsum("mbk,nbk->mnb", xq.long().abs().view(-1, kp // 32, 32), w).double()
    return (mags * xs.double()[:, None, :] * scales.double()[None]).sum(-1) * 1e-6 + 1e-9


# (rows, K, N): a decode step (1, 3, 13, 16: the VNNI pass takes 16 rows, 8 at a time), one past the row
# block of 16, a prefill chunk; 1B-shaped K
SHAPES = [(1, 64, 32), (3, 2048, 48), (13, 160, 32), (16, 256, 64), (17, 512, 16), (130, 96, 80)]


@pytest.mark.parametrize(("m", "k", "n"), SHAPES)
def test_the_kernel_is_the_exact_block_dots_up_to_fp32_rounding(m: int, k: int, n: int) -> None:
    codes, scales = weights(n, k, seed=m)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(k))
    y = Q8BlockMatmul(codes, scales, consume=False)(x)
    assert y.dtype == torch.float32 and tuple(y.shape) == (m, n)
    assert bool(((y.double() - reference(x, codes, scales)).abs() <= bound(x, codes, scales)).all())


@pytest.mark.parametrize(("m", "k", "n"), SHAPES)
def test_a_row_is_the_same_alone_as_in_any_batch_and_on_any_thread_count(m: int, k: int, n: int) -> None:
    codes, scales = weights(n, k, seed=m)
    layer = Q8BlockMatmul(codes, scales, consume=False)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(k))
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        batch = layer(x)
        torch.set_num_threads(1)
        assert torch.equal(layer(x), batch)
    finally:
        torch.set_num_threads(threads)
    for i in sorted({0, m // 2, m - 1}):
        assert torch.equal(layer(x[i : i + 1]), batch[i : i + 1])
    if m > 1:
        assert torch.equal(torch.cat([layer(x[: m // 3]), layer(x[m // 3 :])]), batch)


def test_activations_are_quantized_per_row_and_block_as_q8_0() -> None:
    """d = amax / 127 per block of 32, q = round(x * (1 / d)) (ties to even), the padding past K zero."""
    x = torch.randn(5, 72, generator=torch.Generator().manual_seed(0))
    x[1, :32] = 0.0  # an all-zero block: scale 0, codes 0
    q, s = quantize_activations(x)
    blocks = torch.nn.functional.pad(x, (0, 96 - 72)).view(5, 3, 32)
    d = blocks.abs().amax(-1) / 127.0
    inv = torch.where(d == 0, torch.zeros_like(d), 1.0 / d)
    assert torch.equal(s, d)
    assert torch.equal(q, torch.round(blocks * inv[..., None]).to(torch.int8).view(5, 96))
    assert int(q.abs().max()) <= 127 and not bool(q[:, 72:].any())


@pytest.mark.parametrize(("k", "n"), [(40, 20), (32, 17), (100, 3)])
def test_shapes_off_the_grid_are_padded_not_refused(k: int, n: int) -> None:
    """K off 32 and N off 16: zero codes past K and zero rows past N, which the kernel never writes out."""
    codes, scales = weights(n, k, seed=k)
    x = torch.randn(4, k, generator=torch.Generator().manual_seed(n))
    layer = Q8BlockMatmul(codes, scales, consume=False)
    y = layer(x)
    assert tuple(y.shape) == (4, n)
    assert bool(((y.double() - reference(x, codes, scales)).abs() <= bound(x, codes, scales)).all())
    ids = torch.tensor([0, n - 1])
    want = codes[ids].float() * scales[ids].repeat_interleave(32, dim=1)[:, :k]
    assert torch.equal(layer.rows(ids), want)


@pytest.mark.parametrize(
    ("codes", "scales"),
    [
        (torch.zeros(16, 64, dtype=torch.int8), torch.zeros(16, 3)),  # scales for another K
        (torch.zeros(16, 64, dtype=torch.int8), torch.zeros(16, 2, dtype=torch.float64)),  # not float32
        (torch.zeros(16, 64, dtype=torch.uint8), torch.zeros(16, 2)),  # not int8 codes
    ],
)
def test_mismatched_components_are_a_typed_error(codes: torch.Tensor, scales: torch.Tensor) -> None:
    with pytest.raises(ValueError, match="q8 blocks"):
        Q8BlockMatmul(codes, scales, consume=False)


def test_a_q8_weight_is_held_exactly_and_a_handed_over_source_zeroed() -> None:
    """The codes and scales the layer holds are the weight's own (rows() gives dequantize()'s floats to
    the bit); with consume, the source is zeroed once packed (the layer's copy is the one plaintext)."""
    codes, scales = weights(48, 128, seed=3)
    w = QuantizedWeight(codes.clone(), QuantSpec("int8", (48, 128), 32, "gguf:Q8_0"), scales.clone())
    layer = Q8BlockMatmul(codes, scales, consume=True)
    assert not bool(codes.any()) and not bool(scales.any())
    assert torch.equal(layer.rows(torch.arange(48)), dequantize(w))


def test_from_float_weights_blocks_of_32_round_trip_within_half_a_step() -> None:
    w = torch.randn(32, 96, generator=torch.Generator().manual_seed(5))
    codes, scales = quantize_blocks(w)
    assert tuple(scales.shape) == (32, 3) and int(codes.abs().max()) == 127
    back = codes.float() * scales.repeat_interleave(32, dim=1)
    assert bool(((back - w).abs() <= scales.repeat_interleave(32, dim=1) / 2 + 1e-7).all())


def test_a_channel_scale_is_every_block_s_scale() -> None:
    """Per-channel int8 checkpoints run in the same kernel: the channel's scale repeated per block."""
    codes, _ = weights(16, 80, seed=9)
    channel = torch.rand(16) * 1e-2
    blocks = channel_scales_to_blocks(channel, 80)
    assert tuple(blocks.shape) == (16, 3) and torch.equal(blocks, channel[:, None].expand(16, 3))
    layer = Q8BlockMatmul(codes, blocks, consume=False)
    assert torch.equal(layer.rows(torch.arange(16)), codes.float() * channel[:, None])


@pytest.mark.parametrize("group_size", [0, 32])
def test_checkpoint_int8_layers_run_the_kernel_on_the_cpu(group_size: int) -> None:
    """A checkpoint's int8 weight, per channel (group_size 0) or per block (32), runs the block kernel
    on the CPU: the same output as the kernel over its weight's codes and block scales."""
    from enclave_worker.engine.layers.quantized_linear import PrequantizedInt8Linear

    codes, blocks = weights(32, 64, seed=group_size)
    scales = blocks if group_size else blocks[:, 0].contiguous()
    w = QuantizedWeight(codes, QuantSpec("int8", (32, 64), group_size, "test"), scales)
    layer = PrequantizedInt8Linear(w, None, torch.float32, "cpu")
    assert isinstance(layer.matmul, Q8BlockMatmul)
    assert torch.equal(layer.matmul.rows(torch.arange(32)), dequantize(w))
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(1))
    want = Q8BlockMatmul(codes, scales if group_size else channel_scales_to_blocks(scales, 64), consume=False)(x)
    assert torch.equal(layer(x), want)


@pytest.mark.parametrize("n,k", [(600, 100), (256, 64), (17, 32), (513, 2048)])
def test_from_float_packs_the_same_codes_chunk_by_chunk(n, k):
    """Quantized straight into the packed layout, a chunk of panels at a time (no [N, K] int8 copy):
    the same codes and scales, bit for bit, as quantizing the whole weight and packing it, padding
    included; the source is left as it was (the caller owns it)."""
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(n + k)) * 0.02
    before = w.clone()
    got = Q8BlockMatmul.from_float(w)
    ref = Q8BlockMatmul(*quantize_blocks(w), consume=True)
    assert torch.equal(got.codes, ref.codes) and torch.equal(got.scales, ref.scales)
    assert (got.out_features, got.in_features) == (n, k) and torch.equal(w, before)
    x = torch.randn(3, k, generator=torch.Generator().manual_seed(1))
    assert torch.equal(got(x), ref(x))
