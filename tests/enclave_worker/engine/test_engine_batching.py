"""Continuous batching: batched == unbatched (greedy), with preemption and chunked prefill."""

from __future__ import annotations

import pytest

from enclave_worker.engine import SamplingParams

GREEDY = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)


@pytest.fixture(scope="module")
def reference(engine, h):
    """Each prompt alone (unbatched)."""
    prompts = [engine.tokenizer.encode(p) for p in h.prompts]
    ref = {}
    for i, p in enumerate(prompts):
        ref[f"r{i}"] = h.tokens_of(h.run_sync(engine, [(f"r{i}", p, GREEDY)])[f"r{i}"])
    return prompts, ref


def _batched(engine, prompts, h):
    outs = h.run_sync(engine, [(f"r{i}", p, GREEDY) for i, p in enumerate(prompts)])
    return {rid: h.tokens_of(o) for rid, o in outs.items()}, outs


def test_batched_equals_unbatched(engine, reference, h):
    prompts, ref = reference
    got, outs = _batched(engine, prompts, h)
    assert got == ref
    for rid, o in outs.items():
        assert o[-1].finished and o[-1].finish_reason == "length"
        assert o[-1].completion_tokens == 24
        assert o[-1].prompt_tokens == len(prompts[int(rid[1:])])


def test_preemption_by_recompute_keeps_tokens(make_engine, reference, h):
    prompts, ref = reference
    # 12 blocks of 16 tokens: far fewer than 8 sequences x ~36 tokens need, so sequences get preempted
    eng = make_engine(kv_cache_memory_bytes=12 * 16 * 46080, enable_prefix_caching=False)
    got, _ = _batched(eng, prompts, h)
    assert eng.stats()["num_preemptions"] > 0
    assert got == ref
    assert eng.stats()["num_free_kv_blocks"] == eng.stats()["num_kv_blocks"]


def test_chunked_prefill_mixed_with_decode(make_engine, reference, h):
    prompts, ref = reference
    eng = make_engine(max_num_batched_tokens=5)  # every prompt is prefilled in several chunks
    got, _ = _batched(eng, prompts, h)
    assert got == ref


def test_requests_join_while_others_decode(engine, reference, h):
    prompts, ref = reference
    outs: dict[str, list] = {}
    for i, p in enumerate(prompts):
        outs[f"r{i}"] = []
        engine.add_request(f"r{i}", p, GREEDY, outs[f"r{i}"].append)
        for _ in range(3):
            engine.step()
    while engine.has_unfinished_requests():
        engine.step()
    assert {rid: h.tokens_of(o) for rid, o in outs.items()} == ref
