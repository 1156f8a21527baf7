"""Bad input raises typed errors before any step, and the engine keeps serving others."""

from __future__ import annotations

import asyncio

import pytest

from enclave_worker.engine import EngineDeadError, EngineError, InvalidRequestError, SamplingParams
from protocol.sampling import InvalidSamplingParams


@pytest.mark.parametrize(
    "kwargs",
    [
        {"temperature": -1.0},
        {"temperature": float("nan")},
        {"top_p": 0.0},
        {"top_p": 1.5},
        {"top_k": -1},
        {"max_tokens": 0},
        {"logprobs": -2},
        {"stop": "x"},
        {"stop_token_ids": (-1,)},
    ],
)
def test_invalid_sampling_params(kwargs):
    # The engine's SamplingParams is the one contract (protocol/sampling.py) and raises its error.
    with pytest.raises(InvalidSamplingParams):
        SamplingParams(**kwargs)
    assert issubclass(InvalidRequestError, EngineError)


async def _collect(engine, rid, prompt, params, salt=b""):
    return [o async for o in engine.generate(rid, prompt, params, salt)]


async def test_bad_requests_do_not_disturb_others(engine):
    good_prompt = engine.tokenizer.encode("Hello there, my name is")
    params = SamplingParams(max_tokens=8, temperature=0)
    good = asyncio.create_task(_collect(engine, "good", good_prompt, params))
    bad_cases = [
        ("too-long", [1] * (engine.max_model_len + 5), params),
        ("empty", [], params),
        ("oov", [10**9], params),
        ("stop-id", good_prompt, SamplingParams(stop_token_ids=(10**7,))),
        ("salt", good_prompt, params, "not-bytes"),
    ]
    for rid, prompt, p, *salt in bad_cases:
        with pytest.raises(InvalidRequestError):
            await _collect(engine, rid, prompt, p, *salt)
    outs = await good
    assert outs[-1].finished and outs[-1].finish_reason in ("stop", "length")
    assert engine.stats()["num_running"] == 0


async def test_duplicate_request_id(engine):
    prompt = engine.tokenizer.encode("Count: one, two,")
    params = SamplingParams(max_tokens=4, temperature=0)
    first = engine.generate("dup", prompt, params)
    got = await first.__anext__()
    with pytest.raises(InvalidRequestError):
        await _collect(engine, "dup", prompt, params)
    rest = [got] + [o async for o in first]
    assert rest[-1].finished


async def test_consumer_cancel_frees_blocks(engine):
    prompt = engine.tokenizer.encode("Write a very long story about a dragon.")
    gen = engine.generate("cancel-me", prompt, SamplingParams(max_tokens=200, temperature=0, ignore_eos=True))
    await gen.__anext__()
    await gen.aclose()  # the consumer stops iterating
    stats = engine.stats()
    assert stats["num_running"] == 0 and stats["num_free_kv_blocks"] == stats["num_kv_blocks"]


async def test_abort_reports_abort(engine):
    prompt = engine.tokenizer.encode("Tell me about the sea.")
    outs = []

    async def consume():
        async for o in engine.generate("ab", prompt, SamplingParams(max_tokens=500, temperature=0, ignore_eos=True)):
            outs.append(o)
            if len(outs) == 2:
                engine.abort("ab")

    await asyncio.wait_for(consume(), 60)
    assert outs[-1].finished and outs[-1].finish_reason == "abort"
    assert engine.stats()["num_free_kv_blocks"] == engine.stats()["num_kv_blocks"]


async def test_a_slow_consumer_gets_what_piled_up_as_one_delta(engine):
    """Outputs that queued while the consumer was busy arrive merged; nothing is lost or reordered."""
    prompt = engine.tokenizer.encode("Count: one, two,")
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    fast = await _collect(engine, "fast", prompt, params)
    gen = engine.generate("slow", prompt, params)
    outs = [await gen.__anext__()]
    while engine.stats()["num_running"]:  # the whole answer is computed while nobody reads
        await asyncio.sleep(0.01)
    outs += [o async for o in gen]
    assert len(outs) < len(fast) and outs[-1].finished and outs[-1].completion_tokens == 12
    assert [t for o in outs for t in o.delta_token_ids] == [t for o in fast for t in o.delta_token_ids]
    assert "".join(o.delta_text for o in outs) == "".join(o.delta_text for o in fast)


async def test_a_failed_step_fails_every_request_by_type_only_and_takes_no_more(make_engine):
    engine = make_engine(kv_cache_memory_bytes=8 << 20)
    prompt = engine.tokenizer.encode("Hello")

    def broken(*_args, **_kwargs):
        raise RuntimeError("text of a prompt")  # an exception's message may quote content

    engine.runner.execute = broken
    with pytest.raises(EngineDeadError) as failed:
        await _collect(engine, "a", prompt, SamplingParams(max_tokens=4, temperature=0))
    assert "RuntimeError" in str(failed.value) and "prompt" not in str(failed.value)
    with pytest.raises(EngineDeadError):  # the stepping thread is gone: no request waits forever
        await _collect(engine, "b", prompt, SamplingParams(max_tokens=4, temperature=0))
    assert not engine.has_unfinished_requests()
    await engine.shutdown()
