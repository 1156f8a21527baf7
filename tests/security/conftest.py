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
    import json

    import httpx

    from api.stack import DEMO_MODEL

    running = start_sealed_up(tmp_path_factory.mktemp("security-stack"), ready_line=True)
    # What a client gets right after the ready line (#14: no 503 after "ready"), for a test to check.
    headers = {"Authorization": f"Bearer {running.api_key}"}
    models = httpx.get(f"{running.url}/v1/models", headers=headers, timeout=30).json()
    chat = httpx.post(f"{running.url}/v1/chat/completions", headers=headers, timeout=120, json={
        "model": DEMO_MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "Hi"}]}).status_code
    (running.tmpdir / "first-contact.json").write_text(json.dumps({"models": models, "chat": chat}))
    yield running
    if running.proc.poll() is None:
        stop_sealed_up(running)
