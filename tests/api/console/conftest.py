"""Fixtures of the console tests (the site is shared by a module: it takes a few seconds to build)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.api.console.site import Site, running_site


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    with running_site(tmp_path_factory.mktemp("console")) as running:
        yield running


@pytest.fixture(scope="session")
def screenshot_dir() -> Path:
    path = Path(__file__).resolve().parents[3] / "test-artifacts" / "screenshots"
    path.mkdir(parents=True, exist_ok=True)
    return path
