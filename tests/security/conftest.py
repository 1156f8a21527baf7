"""Security regression tests reuse the key broker's in-process harness."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from pathlib import Path

import pytest

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
