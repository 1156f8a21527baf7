"""The per-step thread count follows measured step times (enclave_worker/engine/threads.py)."""

from __future__ import annotations

import pytest
import torch

from enclave_worker.engine.threads import (
    EAGER_MAX_TOKENS,
    EXPLORE_EVERY,
    MAX_BACKOFF,
    ThreadPools,
    ThreadTuner,
    available_cpus,
    step_kind,
)


def _run(tuner: ThreadTuner, kind: tuple[bool, int], cost: dict[int, float], steps: int) -> list[int]:
    chosen = []
    for _ in range(steps):
        t = tuner.choose(kind)
        tuner.record(kind, t, cost[t])
        chosen.append(t)
    return chosen


def test_picks_the_faster_count_and_keeps_checking_the_other() -> None:
    tuner, kind = ThreadTuner(2), step_kind(True, 16)
    chosen = _run(tuner, kind, {1: 4.0, 2: 5.0}, 4 + 4 * EXPLORE_EVERY)
    assert sorted(chosen[:4]) == [1, 1, 2, 2]  # both measured first
    tail = chosen[4:]
    assert 2 <= tail.count(2) <= 4 and tail.count(1) == len(tail) - tail.count(2)  # exploration only


def test_a_large_step_runs_on_all_threads_first_and_tries_one_thread_late() -> None:
    """A prefill step on the wrong count costs seconds: it is never among the first measurements."""
    tuner, kind = ThreadTuner(2), step_kind(False, 2048)
    assert kind[1] > EAGER_MAX_TOKENS
    chosen = _run(tuner, kind, {1: 9.0, 2: 5.0}, 2 * EXPLORE_EVERY + 2)
    assert chosen[:EXPLORE_EVERY] == [2] * EXPLORE_EVERY
    assert chosen.count(1) == 1  # the periodic try only (the next after 1.8 x EXPLORE_EVERY steps)
    # ... and a machine where one thread is faster (a busy core) is still found
    loaded, kind = ThreadTuner(2), step_kind(False, 512)
    later = _run(loaded, kind, {1: 5.0, 2: 30.0}, 2 * EXPLORE_EVERY)
    assert later[-EXPLORE_EVERY:].count(1) >= EXPLORE_EVERY - 1


def test_a_much_slower_count_is_tried_less_often() -> None:
    tuner, kind = ThreadTuner(2), step_kind(True, 1)
    chosen = _run(tuner, kind, {1: 1.0, 2: 100.0}, 4 + 2 * EXPLORE_EVERY * MAX_BACKOFF)
    assert chosen[4:].count(2) == 2  # once per EXPLORE_EVERY * MAX_BACKOFF steps


def test_follows_a_load_change() -> None:
    tuner, kind = ThreadTuner(2), step_kind(False, 1)
    _run(tuner, kind, {1: 5.0, 2: 3.0}, 40)
    assert tuner.choose(kind) == 2
    # another process takes a core: two threads now cost far more than one
    later = _run(tuner, kind, {1: 5.0, 2: 30.0}, 6 * EXPLORE_EVERY)
    window = later[-2 * EXPLORE_EVERY:]
    assert window.count(2) <= 1 and window.count(1) >= len(window) - 1  # back on one thread


def test_kinds_are_separate_and_one_thread_never_tunes() -> None:
    assert step_kind(True, 16) != step_kind(True, 17)
    assert step_kind(False, 100) == step_kind(False, 120) != step_kind(False, 300)
    single = ThreadTuner(1)
    assert not single.active and single.choose(step_kind(True, 1)) == 1
    tuner = ThreadTuner(4)
    _run(tuner, step_kind(True, 8), {1: 1.0, 4: 2.0}, 8)
    assert set(tuner.snapshot()) == {"blas:8"}
    assert available_cpus() >= 1


def test_pools_set_both_counts() -> None:
    before = torch.get_num_threads()
    try:
        pools = ThreadPools()
        pools.set(1, 1)
        assert torch.get_num_threads() == 1
        if pools._blas:
            assert all(lib.get_num_threads() == 1 for lib in pools._blas)
    finally:
        torch.set_num_threads(before)


def test_returns_to_all_threads_when_the_load_goes() -> None:
    tuner, kind = ThreadTuner(2), step_kind(True, 1)
    _run(tuner, kind, {1: 3.0, 2: 30.0}, 4 + EXPLORE_EVERY * MAX_BACKOFF)
    assert tuner.choose(kind) == 1
    after = _run(tuner, kind, {1: 3.0, 2: 1.0}, EXPLORE_EVERY * MAX_BACKOFF + 4)
    assert after[-3:] == [2, 2, 2]  # one try at the faster count is enough


def test_the_engine_thread_sets_openblas_after_the_main_thread_did() -> None:
    """threadpoolctl >= 3.8 lets only the first thread that set a limit change OpenBLAS; the engine
    steps on its own thread, so its sets must take effect (they silently did not: half-speed GEMMs)."""
    import threading

    from threadpoolctl import threadpool_limits

    pools = ThreadPools()
    if not pools._blas or available_cpus() < 2:
        pytest.skip("needs numpy's OpenBLAS and two CPUs")
    threadpool_limits(1, user_api="blas")  # what build_model does, on the main thread
    seen: list[list[int]] = []

    def step() -> None:
        pools.set(1, 2)
        seen.append([lib.get_num_threads() for lib in pools._blas])
        pools.set(1, 1)

    before = torch.get_num_threads()
    try:
        worker = threading.Thread(target=step)
        worker.start()
        worker.join()
    finally:
        torch.set_num_threads(before)
    assert seen == [[2] * len(pools._blas)]
