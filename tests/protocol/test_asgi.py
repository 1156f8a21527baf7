"""Every role's process: FastAPI's native OpenTelemetry off, the start-up heap frozen, full GC passes on a timer."""

from __future__ import annotations

import gc
import time
import weakref
from pathlib import Path

import pytest
from fastapi import FastAPI

from protocol.asgi import FullCollections, freeze_startup_heap, schedule_full_collections, without_native_telemetry


def test_the_options_turn_native_telemetry_off_even_with_a_provider_configured(monkeypatch: pytest.MonkeyPatch
                                                                               ) -> None:
    app = FastAPI(**without_native_telemetry())
    if not hasattr(app, "_native_telemetry"):
        pytest.skip("this FastAPI has no native telemetry")
    from opentelemetry import metrics

    monkeypatch.setattr(metrics, "get_meter_provider", lambda: object())  # "configured": not a deferred proxy
    assert FastAPI()._native_telemetry.enabled()  # the default would do the per-request work
    assert not app._native_telemetry.enabled()


def test_an_older_fastapi_without_the_option_gets_no_argument(monkeypatch: pytest.MonkeyPatch) -> None:
    def old_init(self: object, *, title: str = "", docs_url: str | None = None) -> None:  # no `telemetry`
        pass

    monkeypatch.setattr(FastAPI, "__init__", old_init)
    assert without_native_telemetry() == {}


def test_freezing_takes_the_start_up_heap_out_of_the_collectors_walk() -> None:
    gc.unfreeze()
    try:
        freeze_startup_heap()
        assert gc.get_freeze_count() > 10_000  # this process's modules, FastAPI and pydantic included
    finally:
        gc.unfreeze()


@pytest.mark.parametrize("entry", ["api/serve.py", "key_broker/__main__.py",
                                   "enclave_worker/cli.py"])
def test_every_roles_process_entry_point_freezes_before_it_serves(entry: str) -> None:
    source = (Path(__file__).resolve().parents[2] / entry).read_text()
    main = source.split("def main(", 1)[1]
    assert "freeze_startup_heap()" in main and "schedule_full_collections()" in main


class _Cycle:
    def __init__(self) -> None:
        self.me = self


def _old_cycle(freed: list[str]) -> None:
    """A cycle that only a full collection can free: promoted to generation 2 before it turns garbage."""
    cycle = _Cycle()
    weakref.finalize(cycle, freed.append, "freed")
    gc.collect(1)  # survives generation 1: now in generation 2
    del cycle


def _serving_like_allocations(rounds: int, until_freed: list[str] | None = None) -> int:
    """Objects that outlive generation-1 passes, as a loaded server's do, so CPython's trigger fires;
    the rounds it took (stops early once `until_freed` is non-empty)."""
    kept: list[list[int]] = []
    for done in range(1, rounds + 1):
        for i in range(50_000):
            kept.append([i])  # a list is always tracked (a dict of ints is not)
        kept = kept[-50_000:]
        if until_freed:
            return done
    return rounds


def test_cpythons_own_trigger_never_runs_a_full_pass_while_scheduled() -> None:
    saved = gc.get_threshold()
    freed: list[str] = []
    _old_cycle(freed)
    needed = _serving_like_allocations(100, until_freed=freed)
    assert freed == ["freed"]  # the control: unscheduled, CPython's trigger ran a full pass
    schedule = schedule_full_collections(3600)
    try:
        assert gc.get_threshold()[:2] == saved[:2]  # young generations as before
        freed.clear()
        _old_cycle(freed)
        _serving_like_allocations(3 * needed)
        assert freed == [] and schedule.collections == 0
    finally:
        schedule.stop()
    assert gc.get_threshold() == saved
    gc.collect()


def test_the_scheduled_pass_frees_old_cycles() -> None:
    freed: list[str] = []
    _old_cycle(freed)
    schedule = schedule_full_collections(0.05)
    try:
        deadline = time.monotonic() + 10
        while not freed and time.monotonic() < deadline:
            time.sleep(0.02)
        assert freed == ["freed"] and schedule.collections >= 1
    finally:
        schedule.stop()


@pytest.mark.parametrize("interval", [0, -1.0, float("nan")])
def test_a_non_positive_interval_is_refused_and_changes_nothing(interval: float) -> None:
    saved = gc.get_threshold()
    with pytest.raises(ValueError, match="positive"):
        FullCollections(interval)
    assert gc.get_threshold() == saved
