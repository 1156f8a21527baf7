"""Sampling parameters, stop conditions, logprobs and stream-safe text."""

from __future__ import annotations

import math

import pytest

from enclave_worker.engine import SamplingParams


def _run(engine, h, prompt, params, rid="s"):
    return h.run_sync(engine, [(rid, prompt, params)])[rid]


def test_seed_reproducible_and_batch_independent(engine, h):
    prompt = engine.tokenizer.encode("Write a poem about autumn:")
    p = SamplingParams(max_tokens=12, temperature=0.9, top_p=0.95, top_k=50, seed=1234, ignore_eos=True)
    a = h.tokens_of(_run(engine, h, prompt, p, "a"))
    outs = h.run_sync(engine, [("b", prompt, p), ("c", engine.tokenizer.encode("Other prompt"), p)])
    assert h.tokens_of(outs["b"]) == a
    other = h.tokens_of(_run(engine, h, prompt, SamplingParams(**{**p.__dict__, "seed": 99}), "d"))
    assert other != a


def test_top_k_one_is_greedy(engine, h):
    prompt = engine.tokenizer.encode("The sun rises in the")
    greedy = h.tokens_of(_run(engine, h, prompt, SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)))
    topk1 = h.tokens_of(_run(engine, h, prompt, SamplingParams(max_tokens=8, top_k=1, seed=5, ignore_eos=True)))
    assert greedy == topk1


def test_stop_string_truncates_and_holds_back(engine, h):
    prompt = engine.tokenizer.encode("Count from one to ten: one, two, three,")
    free = _run(engine, h, prompt, SamplingParams(max_tokens=24, temperature=0, ignore_eos=True))
    text = "".join(o.delta_text for o in free)
    assert "six" in text, text
    outs = _run(engine, h, prompt, SamplingParams(max_tokens=24, temperature=0, stop=("six",)))
    got = "".join(o.delta_text for o in outs)
    assert outs[-1].finish_reason == "stop"
    assert got == text[: text.index("six")]
    assert all("six" not in o.delta_text for o in outs)


def test_stop_token_id_and_max_tokens(engine, h):
    prompt = engine.tokenizer.encode("Count from one to ten: one, two, three,")
    free = h.tokens_of(_run(engine, h, prompt, SamplingParams(max_tokens=10, temperature=0, ignore_eos=True)))
    stop_id = free[3]
    outs = _run(engine, h, prompt, SamplingParams(max_tokens=10, temperature=0, stop_token_ids=(stop_id,)))
    assert h.tokens_of(outs) == free[: free.index(stop_id) + 1]
    assert outs[-1].finish_reason == "stop"
    outs = _run(engine, h, prompt, SamplingParams(max_tokens=3, temperature=0, ignore_eos=True))
    assert outs[-1].finish_reason == "length" and outs[-1].completion_tokens == 3


def test_eos_stops_unless_ignored(engine, h):
    tok = engine.tokenizer
    prompt = tok.encode(tok.apply_chat_template([{"role": "user", "content": "Say hi."}]))
    outs = _run(engine, h, prompt, SamplingParams(max_tokens=64, temperature=0))
    assert outs[-1].finish_reason == "stop"
    assert h.tokens_of(outs)[-1] in tok.eos_token_ids
    assert "<|im_end|>" not in "".join(o.delta_text for o in outs)


def test_logprobs_with_alternatives(engine, h):
    prompt = engine.tokenizer.encode("The capital of France is")
    outs = _run(engine, h, prompt, SamplingParams(max_tokens=4, temperature=0, logprobs=3, ignore_eos=True))
    records = [r for o in outs for r in o.logprobs]
    assert [r.token_id for r in records] == h.tokens_of(outs)
    for r in records:
        assert len(r.top) == 3 and r.top[0][0] == r.token_id  # greedy picks the best
        assert r.logprob <= 0 and math.isclose(r.logprob, r.top[0][1], rel_tol=1e-5)
        assert r.top[0][1] >= r.top[1][1] >= r.top[2][1]


def test_streamed_text_is_stable_with_multibyte_tokens(engine, h):
    tok = engine.tokenizer
    prompt = tok.encode(tok.apply_chat_template([{"role": "user", "content": "Reply with emoji: 🤖🎉 漢字"}]))
    outs = _run(engine, h, prompt, SamplingParams(max_tokens=24, temperature=0.8, seed=3, ignore_eos=True))
    text = "".join(o.delta_text for o in outs)
    assert "\ufffd" not in text
    assert text == tok.decode(h.tokens_of(outs))
    # a token sequence that splits a multi-byte character across tokens
    ids = tok.encode("🤖🎉")
    pieces, prefix, read = [], 0, 0
    for i in range(1, len(ids) + 1):
        piece, prefix, read = tok.decode_incremental(ids[:i], prefix, read)
        pieces.append(piece)
    assert "".join(pieces) == "🤖🎉" and all("\ufffd" not in p for p in pieces)


def test_chat_template(engine):
    text = engine.tokenizer.apply_chat_template([{"role": "user", "content": "hi"}])
    assert text.startswith("<|im_start|>system\n") and text.endswith("<|im_start|>assistant\n")


def test_draw_follows_the_distribution_and_never_picks_a_cut_token():
    """The inverse-CDF draw (layers/sampler.py::draw) against the probabilities it was given."""
    import torch

    from enclave_worker.engine.layers.sampler import draw

    probs = torch.tensor([0.5, 0.0, 0.3, 0.0, 0.2])
    gen = torch.Generator().manual_seed(7)
    n = 20000
    picks = []
    for _ in range(n // 100):
        picks += draw(probs.expand(100, -1), [gen] * 100)
    counts = [picks.count(t) for t in range(5)]
    assert counts[1] == counts[3] == 0  # probability zero (top-k / top-p cut): never drawn
    for t, p in ((0, 0.5), (2, 0.3), (4, 0.2)):
        sd = math.sqrt(n * p * (1 - p))
        assert abs(counts[t] - n * p) < 5 * sd, counts
    # each row from its own generator: same seed, same draw; the last token is reachable
    a = draw(torch.tensor([[0.25, 0.25, 0.25, 0.25]] * 2),
             [torch.Generator().manual_seed(1), torch.Generator().manual_seed(1)])
    assert a[0] == a[1]
    assert draw(torch.tensor([[0.0, 0.0, 1.0]]), [torch.Generator().manual_seed(3)]) == [2]


@pytest.mark.parametrize("vocab", [5, 1024, 1025, 49152, 50000])
def test_draw_picks_what_one_running_sum_over_the_row_picks(vocab):
    """The two-level sum (chunks, then inside one chunk) lands every uniform where a float64 running
    sum over the whole row does, with cut tokens, whole chunks without mass and a ragged last chunk."""
    import torch

    from enclave_worker.engine.layers.sampler import DRAW_CHUNK, draw

    def one_level(probs, generators):
        cdf = probs.double().cumsum(-1)
        u = torch.stack([torch.rand((), dtype=torch.float64, generator=g) for g in generators])
        return torch.searchsorted(cdf, (u * cdf[:, -1]).unsqueeze(-1), right=True).squeeze(-1).tolist()

    g = torch.Generator().manual_seed(vocab)
    logits = torch.randn(24, vocab, generator=g) * torch.rand(24, 1, generator=g) * 8
    logits[:8, torch.rand(vocab, generator=g) < 0.6] = float("-inf")  # top-k / top-p cuts
    logits[8:12, : min(vocab - 1, 2 * DRAW_CHUNK)] = float("-inf")  # leading chunks without mass
    logits[:, -1] = 0.0  # every row keeps some mass
    probs = logits.softmax(-1)
    for seed in range(5):
        seeds = [seed * 100 + row for row in range(24)]
        picked = draw(probs, [torch.Generator().manual_seed(s) for s in seeds])
        assert picked == one_level(probs, [torch.Generator().manual_seed(s) for s in seeds])
        assert all(probs[row, token] > 0 for row, token in enumerate(picked))


def _full_sort_top_p(logits, top_p):
    """The reference: sort the whole vocabulary, keep the smallest prefix with mass >= top_p."""
    import torch

    values, order = torch.sort(logits, descending=True)
    probs = values.softmax(-1)
    drop = probs.cumsum(-1) - probs > top_p
    return logits.masked_fill(torch.zeros_like(drop).scatter(0, order, drop), float("-inf"))


def test_top_p_looks_among_the_likeliest_first_and_keeps_what_a_full_sort_keeps():
    import torch

    from enclave_worker.engine.layers import sampler

    gen = torch.Generator().manual_seed(11)
    calls = {"sort": 0}
    real_sort = torch.sort

    def counting_sort(*a, **k):
        calls["sort"] += 1
        return real_sort(*a, **k)

    cases = []
    for scale in (8.0, 3.0, 0.05):  # peaked (nucleus among the candidates) to flat (it is not)
        for top_p in (0.1, 0.5, 0.9, 0.95, 0.999):
            cases.append(((torch.randn(49152, generator=gen) * scale), top_p))
    masked = torch.randn(49152, generator=gen) * 3.0  # top-k's -inf first, as _filter applies it
    masked[masked < masked.topk(40).values[-1]] = float("-inf")
    cases += [(masked, 0.9), (torch.randn(100, generator=gen), 0.8)]  # and a vocabulary smaller than k
    sorted_cases = 0
    for logits, top_p in cases:
        before = calls["sort"]
        torch.sort = counting_sort
        try:
            fast = sampler.top_p_filter(logits, top_p)
        finally:
            torch.sort = real_sort
        sorted_cases += calls["sort"] - before
        reference = _full_sort_top_p(logits, top_p)
        assert torch.equal(torch.isinf(fast), torch.isinf(reference)), (top_p, logits.shape)
        assert torch.equal(fast[~torch.isinf(fast)], logits[~torch.isinf(reference)])
    # The flat cases fell back to the full sort, the peaked ones did not.
    assert 0 < sorted_cases < len(cases)
