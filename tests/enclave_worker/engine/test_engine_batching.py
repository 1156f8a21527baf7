"""Continuous batching: batched == unbatched (greedy), with preemption and chunked prefill."""

from __future__ import annotations

import pytest
import torch

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


@pytest.mark.parametrize("decode_kernels", ["auto", "torch"])  # the C++ kernel's lengths; torch's masks
def test_a_decode_steps_inputs_equal_the_general_paths(make_engine, h, decode_kernels):
    """The all-decode fast path (`_prepare_decodes`, Python ints) builds exactly what the general path
    builds for the same batch: ids, positions, slots (across block boundaries), block tables, lengths
    or masks, and which rows sample."""
    eng = make_engine(decode_kernels=decode_kernels)
    runner = eng.runner
    fast, compared = runner._prepare_decodes, []

    def both(batch):
        got, want = fast(batch), runner._prepare_mixed(batch)
        for a, b in zip(got[:2], want[:2], strict=True):
            assert a.dtype == b.dtype and torch.equal(a, b)
        for field in ("slot_mapping", "decode_index", "decode_blocks", "decode_mask", "decode_lens"):
            a, b = getattr(got[2], field), getattr(want[2], field)
            assert (a is None) == (b is None), field
            assert a is None or (a.dtype == b.dtype and torch.equal(a, b)), field
        assert (got[2].prefills, got[2].all_decode, got[2].single_decode_len) == (
            want[2].prefills, want[2].all_decode, want[2].single_decode_len)
        assert got[3] == want[3]
        compared.append(len(batch))
        return got

    runner._prepare_decodes = both
    prompts = [eng.tokenizer.encode(p) for p in h.prompts[:3]]
    params = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)  # contexts cross block boundaries
    outs = h.run_sync(eng, [(f"r{i}", p, params) for i, p in enumerate(prompts)])
    assert all(len(h.tokens_of(o)) == 40 for o in outs.values())
    assert 3 in compared and len(compared) >= 39
    single = h.run_sync(eng, [("one", prompts[0], SamplingParams(max_tokens=3, temperature=0))])
    assert len(h.tokens_of(single["one"])) == 3 and compared[-1] == 1  # one decode: its own length, no mask
