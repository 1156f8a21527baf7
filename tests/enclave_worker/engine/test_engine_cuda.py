"""The same engine code on CUDA (skipped unless --run-gpu)."""

from __future__ import annotations

import pytest
import torch

from enclave_worker.engine import SamplingParams

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int8", "int4"])
def test_cuda_greedy_matches_cpu(make_engine, engine, h, dtype):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    gpu = make_engine(device="cuda", dtype=dtype)
    prompt = engine.tokenizer.encode("The capital of France is")
    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    got = h.tokens_of(h.run_sync(gpu, [("g", prompt, params)])["g"])
    ref = h.tokens_of(h.run_sync(engine, [("c", prompt, params)])["c"])
    if dtype == "float32":
        assert got == ref
    else:
        assert len(got) == 8 and got[:2] == ref[:2]
