"""Weight-only int8 / int4 / FP8 quantized matmuls: perplexity on a fixed text stays close to fp32."""

from __future__ import annotations

import pytest

from tests.enclave_worker.engine.perplexity import perplexity

TEXT = (
    "The Industrial Revolution began in Great Britain in the late eighteenth century. New machines for "
    "spinning and weaving cotton changed how cloth was made, and steam engines supplied power to factories, "
    "mines and railways. Cities grew quickly as workers moved from farms to find jobs in the new mills. "
    "Living conditions were often poor, but over time wages rose and goods became cheaper for everyone."
)


@pytest.fixture(scope="module")
def ppl_fp32(engine):
    return perplexity(engine, engine.tokenizer.encode(TEXT))


@pytest.mark.parametrize(("dtype", "bound"), [("int8", 0.02), ("int4", 0.10), ("fp8", 0.06)])
def test_quantized_perplexity_close_to_fp32(make_engine, engine, ppl_fp32, dtype, bound):
    q = make_engine(dtype=dtype, max_num_seqs=2, kv_cache_memory_bytes=16 << 20)
    ppl = perplexity(q, engine.tokenizer.encode(TEXT))
    assert 1.0 < ppl_fp32 < 100
    assert abs(ppl - ppl_fp32) / ppl_fp32 < bound, (dtype, ppl, ppl_fp32)


@pytest.mark.parametrize("kernels", ["torch", "auto"])
def test_bf16_perplexity_within_one_percent_of_fp32(make_engine, engine, ppl_fp32, kernels):
    """bf16 within 1% perplexity of fp32 (issue #14): on its CPU path (oneDNN packed where the CPU has
    bf16 instructions, torch's kernels otherwise) and on the torch reference path."""
    from enclave_worker.engine.layers.packed import bf16_native

    bf16 = make_engine(dtype="bfloat16", decode_kernels=kernels, max_num_seqs=2, kv_cache_memory_bytes=16 << 20)
    packed = kernels == "auto" and bf16_native()
    assert bf16.model.layers[0].gate_up_proj.weight.is_mkldnn == packed
    ppl = perplexity(bf16, engine.tokenizer.encode(TEXT))
    assert abs(ppl - ppl_fp32) / ppl_fp32 < 0.01, (kernels, ppl, ppl_fp32)


def test_quantized_generation_runs(make_engine, h):
    q = make_engine(dtype="int4", max_num_seqs=2, kv_cache_memory_bytes=16 << 20)
    prompt = q.tokenizer.encode("The capital of France is")
    from enclave_worker.engine import SamplingParams

    outs = h.run_sync(q, [("q", prompt, SamplingParams(max_tokens=6, temperature=0))])["q"]
    assert outs[-1].finished and "Paris" in "".join(o.delta_text for o in outs)
