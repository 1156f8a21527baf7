"""The phases of one worker's start, from its process to its first token (docs/tracing.md, docs/deploy.md).

boot           the process started -> ready to ask for a key (imports, the tenant's policy, the GPU check,
               the attester; a warm worker: until it has attested once and waits for an assignment)
assign         a warm worker only: its assignment arrived -> ready to ask for a key (the boot's own checks,
               run again: the GPU, the package's fit)
broker         the key broker's own evidence checked under a fresh nonce, and the key request's nonce
attest         the TEE's evidence for the key request (and the GPU's), made with the broker's nonce
release        the rest of the key-release exchange: the broker verifies, appraises and seals the key
decrypt        the package, segment by segment, into memory (or GPU memory)
load           the engine built from the plaintext (layouts, kernels, the KV pool)
announce       loaded -> a gateway answered the heartbeat that says "ready" (it checks the attestation
               that beat carries before it answers: from then on it routes here)
first_request  the end of the phases before -> the first request reached the worker
first_token    the first request reached the worker -> its first token left the engine

Each phase is a (start, end) pair of ``time.monotonic()`` readings; from ``assign`` (a cold worker: from
``boot``) to ``first_token`` they follow one another, so their sum is the start's whole time. They are
exported as gauges in the worker's status (``sealed:cold_start_<phase>_seconds``, which the gateway's
/metrics serves per worker) and, with tracing on, as ``worker.<phase>`` spans under one
``worker.cold_start`` span, opened when the boot starts (a standby worker's: at its assignment) and
ended at its first token (or its failure); ``worker.boot`` starts at the process's start, before its
parent opens. No phase carries an attribute.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from protocol.tracing import NULL_SPAN, Span, Tracing

PHASES = ("boot", "assign", "broker", "attest", "release", "decrypt", "load", "announce", "first_request",
          "first_token")
STAT_PREFIX = "sealed:cold_start_"
T = TypeVar("T")


def process_started(stat: Path = Path("/proc/self/stat")) -> float:
    """When this process started, on the ``time.monotonic()`` clock (Linux: from its start time in
    clock ticks since boot; elsewhere: now)."""
    now = time.monotonic()
    try:
        fields = stat.read_text().rsplit(")", 1)[1].split()
        started_since_boot = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22 of stat(5)
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - started_since_boot
    except (OSError, IndexError, ValueError, AttributeError):
        return now
    return now - max(0.0, age)


@dataclass
class ColdStart:
    """The phases seen so far; each is marked once (a renewal or a second request changes nothing)."""

    started: float = field(default_factory=process_started)
    spans: dict[str, tuple[float, float]] = field(default_factory=dict)
    assigned_at: float | None = None  # a warm worker's assignment (standby.py); None: a cold start
    _tracing: Tracing | None = None
    _root: Span = NULL_SPAN

    def trace(self, tracing: Tracing) -> None:
        """Open the ``worker.cold_start`` span; each phase becomes a span under it as it is marked."""
        if tracing.enabled and self._tracing is None:
            self._tracing, self._root = tracing, tracing.start("worker.cold_start")
            for phase, (start, end) in self.spans.items():  # a standby worker's boot, marked before
                tracing.record(f"worker.{phase}", self._root, start, end)

    def mark(self, phase: str, start: float, end: float | None = None) -> float:
        """Record ``phase`` as (start, end) unless it is recorded already; returns the end."""
        if phase not in PHASES:
            raise ValueError(f"unknown cold-start phase {phase!r}")
        end = time.monotonic() if end is None else end
        if phase in self.spans:
            return end
        self.spans[phase] = (start, max(start, end))
        if self._tracing is not None:
            self._tracing.record(f"worker.{phase}", self._root, *self.spans[phase])
            if phase == PHASES[-1]:
                self.end()
        return end

    def end(self, error: str = "") -> None:
        """End the ``worker.cold_start`` span (at the first token, or a failed start with its error's type)."""
        if self._tracing is not None:
            self._root.end(error=error)
            self._tracing = None

    def assigned(self) -> None:
        """A warm worker was assigned now (its first assignment only: a second one is refused anyway)."""
        if self.assigned_at is None:
            self.assigned_at = time.monotonic()

    def checks_done(self) -> float:
        """The boot's checks before the key request are done: ``boot`` (a cold start) or ``assign`` (a warm
        worker, from its assignment) ends now; returns now."""
        if self.assigned_at is None:
            return self.mark("boot", self.started)
        return self.mark("assign", self.assigned_at)

    def last_end(self) -> float:
        """Where the next phase starts: the latest end marked so far (the process's start if none)."""
        return max((end for _, end in self.spans.values()), default=self.started)

    def announced(self) -> None:
        """A gateway answered the heartbeat that says "ready": ``announce`` from the end of ``load``."""
        if "load" in self.spans:
            self.mark("announce", self.spans["load"][1])

    def first_request(self) -> None:
        """The first request reached the worker (once loaded): ``first_request`` from the latest phase's end."""
        if "load" in self.spans and "first_request" not in self.spans:
            self.mark("first_request", min(self.last_end(), time.monotonic()))

    def first_token(self) -> bool:
        """The first answer's first token left the engine: ``first_token`` from its request's arrival.
        True the one time it is marked."""
        if PHASES[-1] in self.spans or "load" not in self.spans:
            return False
        self.first_request()
        self.mark(PHASES[-1], self.spans["first_request"][1])
        return True

    def timed(self, phase: str, fn: Callable[[], T]) -> T:
        """Run ``fn`` as ``phase``."""
        start = time.monotonic()
        try:
            return fn()
        finally:
            self.mark(phase, start)

    def seconds(self) -> dict[str, float]:
        return {phase: end - start for phase, (start, end) in self.spans.items()}

    def stats(self) -> dict[str, float]:
        """The phases as the worker's status reports them (gauges at the gateway's /metrics)."""
        return {f"{STAT_PREFIX}{phase}_seconds": round(s, 4) for phase, s in self.seconds().items()}
