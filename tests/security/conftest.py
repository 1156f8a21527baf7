"""A real `sealed up` stack for the security regression tests (its own, so attacks don't disturb tests/api)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.api.conftest import RunningStack, start_sealed_up, stop_sealed_up


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningStack]:
    running = start_sealed_up(tmp_path_factory.mktemp("security-stack"))
    yield running
    if running.proc.poll() is None:
        stop_sealed_up(running)
