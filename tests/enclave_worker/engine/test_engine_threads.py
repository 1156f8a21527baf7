"""The engine computes on a fixed thread count (enclave_worker/engine/threads.py): set once when the
model is built on the compute thread, never tuned while serving."""

from __future__ import annotations

import threading

import pytest
import torch

from enclave_worker.engine import EngineConfig, SamplingParams
from enclave_worker.engine.threads import available_cpus, default_threads, single_threaded_caller


def test_available_cpus_counts_this_process_mask() -> None:
    assert 1 <= available_cpus() <= (torch.get_num_threads() + 64)


@pytest.mark.parametrize(("value", "want"), [(None, "cpus"), ("1", 1), ("1,1", 1), ("1000", "cpus"),
                                             ("0", "cpus"), ("-2", "cpus"), ("many", "cpus"), ("", "cpus")])
def test_the_default_count_honours_omp_num_threads_below_the_cpus(monkeypatch: pytest.MonkeyPatch,
                                                                  value: str | None, want: object) -> None:
    if value is None:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    else:
        monkeypatch.setenv("OMP_NUM_THREADS", value)
    assert default_threads() == (available_cpus() if want == "cpus" else want)


def test_the_step_thread_count_is_the_configured_one_and_stays(make_engine, h) -> None:
    eng = make_engine(num_threads=1, kv_cache_memory_bytes=8 << 20)
    assert eng.runner.num_threads == 1
    seen: list[int] = []
    lookup = eng.model.embed.forward

    def spy(ids: torch.Tensor) -> torch.Tensor:  # the first thing a step's forward does
        seen.append(torch.get_num_threads())
        return lookup(ids)

    eng.model.embed.forward = spy
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)  # a caller that steps the engine from a thread of another count
        greedy = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)
        h.run_sync(eng, [("a", eng.tokenizer.encode("One two"), greedy)])
    finally:
        del eng.model.embed.forward
        torch.set_num_threads(before)
    assert len(seen) == 4 and set(seen) == {1}  # every step, prefill and decode, on the configured count


def test_a_thread_count_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="num_threads"):
        EngineConfig(num_threads=0)


def test_single_threaded_caller_sets_only_its_own_thread() -> None:
    before = torch.get_num_threads()
    seen: list[int] = []
    try:
        worker = threading.Thread(target=lambda: (single_threaded_caller(), seen.append(torch.get_num_threads())))
        worker.start()
        worker.join()
    finally:
        torch.set_num_threads(before)
    assert seen == [1]
