"""Penalties, logit_bias and min_p move the token distribution as vLLM's formulas do.

The reference below is written from vLLM's definitions (v1 sampler order: logit_bias, then
`apply_penalties`: repetition over prompt and output, frequency x output count, presence once per
output token; greedy on that; then temperature, min-p, top-k / top-p), one row and one token at a
time in plain Python, so it shares nothing with the batched torch code it checks.
"""

from __future__ import annotations

import math

import pytest
import torch

from enclave_worker.engine import InvalidRequestError, SamplingParams
from enclave_worker.engine.kernels.sampling import BatchSampling, filtered_probs, sample_on_device
from enclave_worker.engine.layers.logits_processors import process
from enclave_worker.engine.layers.sampler import _filter, sample, scaled_rows
from protocol.sampling import InvalidSamplingParams

V = 40


def reference_probs(row: list[float], p: SamplingParams, prompt: list[int], output: list[int]) -> list[float]:
    x = list(row)
    for t, b in p.logit_bias:
        x[t] += b
    seen = set(prompt) | set(output)
    for t in range(len(x)):
        if t in seen:
            x[t] = x[t] / p.repetition_penalty if x[t] > 0 else x[t] * p.repetition_penalty
        x[t] -= p.frequency_penalty * output.count(t) + p.presence_penalty * (t in output)
    if p.greedy:
        best = max(range(len(x)), key=lambda t: x[t])
        return [1.0 if t == best else 0.0 for t in range(len(x))]
    x = [v / p.temperature for v in x]
    z = sum(math.exp(v) for v in x)
    probs = [math.exp(v) / z for v in x]
    top = max(probs)
    x = [v if probs[t] >= p.min_p * top else -math.inf for t, v in enumerate(x)]
    z = sum(math.exp(v) for v in x)
    return [math.exp(v) / z for v in x]


ROWS = [  # (params, prompt tokens, output tokens): one per batch row, all different
    (SamplingParams(temperature=1.0), [1, 2], [3]),
    (SamplingParams(temperature=1.0, presence_penalty=1.5), [1, 2], [3, 3, 3, 7]),
    (SamplingParams(temperature=0.7, frequency_penalty=0.8), [5], [4, 4, 4, 9, 9]),
    (SamplingParams(temperature=1.0, frequency_penalty=-1.0, presence_penalty=-0.5), [], [6, 6, 11]),
    (SamplingParams(temperature=1.0, repetition_penalty=1.7), [0, 1, 2, 3, 4], [10, 11]),
    (SamplingParams(temperature=1.3, repetition_penalty=0.6), [12, 13], [14]),
    (SamplingParams(temperature=1.0, logit_bias=((5, 4.0), (6, -100.0), (7, 1.5))), [1], [2]),
    (SamplingParams(temperature=0.8, min_p=0.2), [1], [2]),
    (SamplingParams(temperature=1.0, min_p=0.05, presence_penalty=0.4, frequency_penalty=0.3,
                    repetition_penalty=1.2, logit_bias=((20, 2.0),)), [20, 21], [20, 22, 22]),
    (SamplingParams(temperature=0, frequency_penalty=2.0, logit_bias=((30, 3.0),)), [], [30, 30]),
]


def _logits(seed: int = 3) -> torch.Tensor:
    return torch.randn(len(ROWS), V, generator=torch.Generator().manual_seed(seed)) * 2.5


def _ours(logits: torch.Tensor) -> list[list[float]]:
    """The host sampler's distribution per row: the very stages `sample` chains."""
    params = [p for p, _, _ in ROWS]
    processed = process(logits, params, [r[1] for r in ROWS], [r[2] for r in ROWS])
    out: list[list[float]] = []
    drawn = [i for i, p in enumerate(params) if not p.greedy]
    scaled = scaled_rows(processed, params, drawn)
    for i, p in enumerate(params):
        if p.greedy:
            best = int(processed[i].argmax())
            out.append([1.0 if t == best else 0.0 for t in range(V)])
        else:
            out.append(_filter(scaled[drawn.index(i)], p).softmax(-1).tolist())
    return out


def test_batched_rows_follow_vllms_formulas_each_with_its_own_settings():
    logits = _logits()
    ours = _ours(logits)
    for i, (p, prompt, output) in enumerate(ROWS):
        ref = reference_probs(logits[i].tolist(), p, prompt, output)
        assert ours[i] == pytest.approx(ref, abs=1e-5), (i, p)
        # the setting moved the distribution (a test that cannot fail checks nothing)
        if i:
            plain = reference_probs(logits[i].tolist(), SamplingParams(temperature=p.temperature or 1.0), [], [])
            assert max(abs(a - b) / max(b, 1e-12) for a, b in zip(ours[i], plain, strict=True)) > 0.1, i


def test_the_device_sampler_applies_min_p_as_the_host_sampler_does():
    logits = _logits(5)
    params = [p for p, _, _ in ROWS if not p.greedy]
    rows = [r for r in ROWS if not r[0].greedy]
    processed = process(logits[: len(rows)], params, [r[1] for r in rows], [r[2] for r in rows])
    batch = BatchSampling.from_lists([p.temperature for p in params], [0] * len(params), [1.0] * len(params), "cpu")
    batch = BatchSampling(batch.temperature, batch.top_k, batch.top_p,
                          min_p=torch.tensor([p.min_p for p in params]))
    device = filtered_probs(processed, batch)
    for i, (p, prompt, output) in enumerate(rows):
        assert device[i].tolist() == pytest.approx(reference_probs(logits[i].tolist(), p, prompt, output), abs=1e-5)
    tokens = sample_on_device(processed, batch, [None] * len(params)).tolist()
    assert all(device[i, t] > 0 for i, t in enumerate(tokens))  # never a token min-p cut


def test_sample_greedy_rows_take_the_argmax_after_bias_and_penalties_and_logprobs_stay_raw():
    logits = torch.ones(2, V)
    logits[:, 3] = 5.0  # 5 / 10 under the repetition penalty: below the others' 1
    params = [SamplingParams(temperature=0, logit_bias=((8, 10.0),), logprobs=1),
              SamplingParams(temperature=0, repetition_penalty=10.0)]
    tokens, records = sample(logits, params, [None, None], ([[], [3]], [[], []]))
    assert tokens[0] == 8 and tokens[1] != 3
    assert records[0] is not None and records[0].top[0][0] == 3  # the raw distribution's best


def test_penalty_settings_outside_their_ranges_are_refused():
    for bad in ({"presence_penalty": 2.5}, {"frequency_penalty": -3}, {"repetition_penalty": 0},
                {"repetition_penalty": float("nan")}, {"min_p": 1.5}, {"min_p": -0.1},
                {"logit_bias": ((1, 101.0),)}, {"logit_bias": ((-1, 1.0),)}, {"logit_bias": ((1, 1.0), (1, 2.0))},
                {"logit_bias": tuple((i, 1.0) for i in range(301))}):
        with pytest.raises(InvalidSamplingParams):
            SamplingParams(**bad)


def test_engine_refuses_a_logit_bias_outside_the_vocabulary(engine):
    params = SamplingParams(max_tokens=2, logit_bias=((engine.vocab_size, 1.0),))
    with pytest.raises(InvalidRequestError, match="logit_bias"):
        engine.add_request("lb-out", engine.tokenizer.encode("hi"), params, lambda _: None)


def test_engine_batch_honours_each_rows_bias_and_penalty(engine, h):
    prompt = engine.tokenizer.encode("Count from one to ten: one, two, three,")
    free = h.tokens_of(h.run_sync(engine, [("f", prompt, SamplingParams(max_tokens=10, temperature=0,
                                                                       ignore_eos=True))])["f"])
    forced = free[0] + 1
    reqs = [("plain", prompt, SamplingParams(max_tokens=10, temperature=0, ignore_eos=True)),
            ("bias", prompt, SamplingParams(max_tokens=4, temperature=0, ignore_eos=True,
                                            logit_bias=((forced, 100.0),))),
            ("ban", prompt, SamplingParams(max_tokens=10, temperature=0, ignore_eos=True,
                                           logit_bias=tuple((t, -100.0) for t in set(free)))),
            ("rep", prompt, SamplingParams(max_tokens=10, temperature=0, ignore_eos=True, repetition_penalty=3.0))]
    outs = {k: h.tokens_of(v) for k, v in h.run_sync(engine, reqs).items()}
    assert outs["plain"] == free  # a row without settings is untouched by its neighbours'
    assert outs["bias"] == [forced] * 4
    assert not set(outs["ban"]) & set(free)
    seen = set(prompt)
    assert outs["rep"] != free
    assert sum(t in seen for t in outs["rep"]) < sum(t in seen for t in free)  # it repeats the prompt less
