"""The phases of a worker's start (enclave_worker/cold_start.py): marked once each, as gauges and spans."""

from __future__ import annotations

import itertools
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from enclave_worker.cold_start import PHASES, ColdStart, process_started
from protocol.tracing.attributes import Value

IMPORTED = time.monotonic()  # this process started before it imported this module


class RecordingTracing:
    enabled = True

    def __init__(self) -> None:
        self.spans: list[tuple[str, Any, float, float]] = []
        self.ended: list[str] = []

    def start(self, name: str, parent: Any = None, *, kind: str = "internal",
              attributes: Mapping[str, Value] | None = None) -> Any:
        tracing = self

        class Root:
            def end(self, error: str = "") -> None:
                tracing.ended.append(f"{name}:{error}")

        return Root()

    def record(self, name: str, parent: Any, start_s: float, end_s: float,
               attributes: Mapping[str, Value] | None = None) -> None:
        assert attributes is None  # a phase carries nothing but its times
        self.spans.append((name, parent, start_s, end_s))


def test_phases_are_marked_once_in_order_and_exported_as_gauges() -> None:
    cold = ColdStart(started=10.0)
    assert cold.mark("boot", 10.0, 12.0) == 12.0
    cold.mark("boot", 10.0, 99.0)  # a second boot (a renewal) changes nothing
    cold.mark("broker", 12.0, 12.2)
    cold.mark("attest", 12.2, 12.5)
    cold.mark("release", 12.5, 13.0)
    cold.mark("decrypt", 13.0, 15.0)
    cold.mark("load", 15.0, 16.0)
    cold.mark("announce", 16.0, 16.5)
    assert cold.first_token()
    first_request, first = cold.spans["first_request"], cold.spans["first_token"]
    assert first_request[0] == 16.5 and first[0] == first_request[1] and first[1] >= first[0]
    assert not cold.first_token()  # once
    stats = cold.stats()
    assert stats["sealed:cold_start_boot_seconds"] == 2.0 and stats["sealed:cold_start_decrypt_seconds"] == 2.0
    assert list(cold.spans) == [p for p in PHASES if p != "assign"]  # a cold start has no assignment


def test_a_warm_start_is_covered_from_its_assignment_to_its_first_token() -> None:
    """Each phase from the assignment on starts where the one before ended: their sum is the whole time."""
    cold = ColdStart(started=0.0)
    cold.mark("boot", 0.0, 1.0)  # attested, then waiting: not part of the warm start
    cold.assigned()
    assigned = cold.assigned_at
    assert assigned is not None
    cold.assigned()  # a second assignment does not move the first
    assert cold.assigned_at == assigned
    checks_done = cold.checks_done()
    assert cold.spans["assign"] == (assigned, checks_done) and cold.spans["boot"] == (0.0, 1.0)
    for phase in ("broker", "attest", "release", "decrypt", "load"):
        cold.mark(phase, cold.last_end())
    cold.announced()
    cold.announced()  # every later ready beat changes nothing
    cold.first_request()
    assert cold.first_token()
    after = [cold.spans[p] for p in PHASES[1:]]
    assert all(prev[1] == nxt[0] for prev, nxt in itertools.pairwise(after))
    assert sum(cold.seconds()[p] for p in PHASES[1:]) == pytest.approx(cold.spans["first_token"][1] - assigned)


def test_a_cold_start_checks_end_its_boot_not_an_assignment() -> None:
    cold = ColdStart(started=0.0)
    assert cold.checks_done() == cold.spans["boot"][1]
    assert "assign" not in cold.spans


def test_nothing_is_announced_or_requested_before_the_model_is_loaded() -> None:
    cold = ColdStart(started=0.0)
    cold.mark("boot", 0.0, 1.0)
    cold.announced()  # a beat of "ready" cannot precede the load; a stray call records nothing
    cold.first_request()
    assert list(cold.spans) == ["boot"]


def test_no_first_token_before_the_model_is_loaded() -> None:
    cold = ColdStart(started=0.0)
    assert not cold.first_token()
    assert cold.spans == {}


def test_an_unknown_phase_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown cold-start phase"):
        ColdStart(started=0.0).mark("prefill", 0.0, 1.0)


def test_an_end_before_its_start_is_clamped_to_a_zero_length_phase() -> None:
    cold = ColdStart(started=0.0)
    cold.mark("decrypt", 5.0, 4.0)
    assert cold.seconds() == {"decrypt": 0.0}


def test_spans_go_under_one_root_that_ends_at_the_first_token() -> None:
    tracing = RecordingTracing()
    cold = ColdStart(started=1.0)
    cold.trace(tracing)  # type: ignore[arg-type]
    for i, phase in enumerate(PHASES[:-1]):
        cold.mark(phase, 1.0 + i, 2.0 + i)
    assert tracing.ended == []
    assert cold.first_token()
    assert [name for name, *_ in tracing.spans] == [f"worker.{p}" for p in PHASES]
    assert len({id(parent) for _, parent, *_ in tracing.spans}) == 1
    assert tracing.ended == ["worker.cold_start:"]
    cold.end("late")  # ended once
    assert tracing.ended == ["worker.cold_start:"]


def test_a_failed_start_ends_the_root_with_its_error() -> None:
    tracing = RecordingTracing()
    cold = ColdStart(started=1.0)
    cold.trace(tracing)  # type: ignore[arg-type]
    cold.end("ModelDoesNotFit")
    assert tracing.ended == ["worker.cold_start:ModelDoesNotFit"]


def test_the_process_start_is_read_from_proc_and_lies_in_the_past(tmp_path: Path) -> None:
    assert process_started() < IMPORTED  # read from /proc/self/stat, not "now"
    assert process_started(tmp_path / "missing") > IMPORTED  # no /proc: now
    (tmp_path / "stat").write_text("1 (a) b)\n")  # malformed: now
    assert process_started(tmp_path / "stat") > IMPORTED


def test_phases_marked_before_tracing_opens_are_recorded_under_the_root() -> None:
    tracing = RecordingTracing()
    cold = ColdStart(started=1.0)
    cold.mark("boot", 1.0, 3.0)  # a standby worker: booted and attested before its assignment
    cold.trace(tracing)  # type: ignore[arg-type]
    cold.mark("attest", 5.0, 6.0)
    assert [(name, start, end) for name, _, start, end in tracing.spans] == [("worker.boot", 1.0, 3.0),
                                                                              ("worker.attest", 5.0, 6.0)]
