"""The model is built on the thread that later steps it (enclave_worker/engine/compute_thread.py)."""

from __future__ import annotations

import asyncio
import threading

import pytest
import torch

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


def test_a_passing_thread_returns_or_raises_and_has_ended() -> None:
    """The worker's boot runs there (enclave_worker/lifecycle.py): the thread, and the OpenMP team torch
    started on it, are gone once the boot is done, leaving the stepping thread's team alone."""
    from enclave_worker.engine.compute_thread import on_a_passing_thread

    ran_on: list[threading.Thread] = []

    def work() -> int:
        ran_on.append(threading.current_thread())
        torch.zeros(1 << 20).add_(1)  # a parallel op: this thread gets an OpenMP team
        return 7

    def fail() -> None:
        raise ValueError("bad package")

    async def run() -> None:
        assert await on_a_passing_thread(work, "boot") == 7
        with pytest.raises(ValueError, match="bad package"):
            await on_a_passing_thread(fail, "boot")

    asyncio.run(run())
    (thread,) = ran_on
    assert thread is not threading.main_thread() and thread.name == "boot"
    thread.join(5)
    assert not thread.is_alive()


def test_a_cancelled_wait_for_a_passing_thread_leaves_the_loop_sound() -> None:
    from enclave_worker.engine.compute_thread import on_a_passing_thread

    release = threading.Event()

    async def run() -> str:
        task = asyncio.create_task(on_a_passing_thread(lambda: release.wait(5), "boot"))
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        release.set()  # the thread finishes after its waiter has gone: its result is dropped
        await asyncio.sleep(0.05)
        return "loop still runs"

    assert asyncio.run(run()) == "loop still runs"
