"""The model is built on the thread that later steps it (enclave_worker/engine/compute_thread.py)."""

from __future__ import annotations

import asyncio
import threading

import pytest

from enclave_worker.engine import SamplingParams
from enclave_worker.engine.compute_thread import ComputeThread


def test_build_and_steps_run_on_one_thread_that_ends_at_shutdown(make_engine) -> None:
    eng = make_engine(kv_cache_memory_bytes=8 << 20)
    built_on = eng._compute.thread  # the thread from_checkpoint built the model on
    assert built_on is not threading.current_thread() and built_on.is_alive()
    stepped_on: set[threading.Thread] = set()
    execute = eng.runner.execute

    def recording(*args, **kwargs):
        stepped_on.add(threading.current_thread())
        return execute(*args, **kwargs)

    eng.runner.execute = recording

    async def run() -> None:
        greedy = SamplingParams(max_tokens=3, temperature=0, ignore_eos=True)
        async for _ in eng.generate("r", eng.tokenizer.encode("Hello"), greedy):
            pass
        await eng.shutdown()

    asyncio.run(run())
    assert stepped_on == {built_on}
    assert not built_on.is_alive()  # the loop was its last call


def test_an_engine_never_stepped_ends_its_thread_at_shutdown(make_engine) -> None:
    eng = make_engine(kv_cache_memory_bytes=8 << 20)
    thread = eng._compute.thread
    asyncio.run(eng.shutdown())
    assert not thread.is_alive()


def test_an_engine_dropped_without_shutdown_ends_its_thread(make_engine) -> None:
    """Tests and callers that step directly never call shutdown(): the idle thread must not outlive them."""
    import gc

    eng = make_engine(kv_cache_memory_bytes=8 << 20)
    thread = eng._compute.thread
    del eng
    gc.collect()
    thread.join(10)
    assert not thread.is_alive()


def test_a_failed_call_raises_to_the_caller_and_the_thread_ends_when_closed() -> None:
    compute = ComputeThread("test-compute")

    def fail() -> None:
        raise ValueError("bad checkpoint")

    with pytest.raises(ValueError, match="bad checkpoint"):
        compute.call(fail)
    assert compute.call(lambda: threading.current_thread()) is compute.thread  # still serves calls
    compute.close()
    compute.thread.join(5)
    assert not compute.thread.is_alive()
