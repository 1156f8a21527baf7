"""Security regression tests: the key broker's in-process harness, and a real `sealed up` stack of
their own (so attacks don't disturb tests/api)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.api.conftest import RunningStack, start_sealed_up, stop_sealed_up
from tests.key_broker.conftest import Clock, Harness


class WallClock(Clock):
    """Lease requests carry the worker's wall-clock time; the broker must agree with it."""

    def __call__(self) -> dt.datetime:
        return dt.datetime.now(dt.UTC)


@pytest.fixture()
def kb(tmp_path: Path) -> Iterator[Harness]:
    harness = Harness(tmp_path / "kb", WallClock(), rate_limit_per_minute=5)
    yield harness
    harness.close()


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningStack]:
    running = start_sealed_up(tmp_path_factory.mktemp("security-stack"))
    yield running
    if running.proc.poll() is None:
        stop_sealed_up(running)
