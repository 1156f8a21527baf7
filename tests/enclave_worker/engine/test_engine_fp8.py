"""FP8 (e4m3) weight-only linear: close to the dense matmul, and the engine serves with it."""

from __future__ import annotations

import torch

from enclave_worker.engine import SamplingParams
from enclave_worker.engine.layers.linear import Fp8Linear, LinearOptions, make_linear


def test_fp8_linear_is_close_to_dense() -> None:
    g = torch.Generator().manual_seed(0)
    w, b, x = torch.randn(96, 64, generator=g), torch.randn(96, generator=g), torch.randn(5, 64, generator=g)
    layer = make_linear(w.clone(), b.clone(), LinearOptions(quant="fp8"))
    assert isinstance(layer, Fp8Linear) and layer.qweight.dtype == torch.float8_e4m3fn
    want = x @ w.T + b
    got = layer(x)
    # e4m3 keeps 3 mantissa bits: a few percent of the output's scale
    assert (got - want).abs().max() <= 0.06 * want.abs().max()


def test_engine_serves_fp8(make_engine, h) -> None:  # type: ignore[no-untyped-def]
    eng = make_engine(dtype="fp8")
    prompt = eng.tokenizer.encode("The capital of France is")
    out = h.tokens_of(h.run_sync(eng, [("f", prompt, SamplingParams(max_tokens=4, temperature=0))])["f"])
    assert 1 <= len(out) <= 4
