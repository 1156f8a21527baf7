"""Every role's FastAPI app leaves FastAPI's native OpenTelemetry off (a per-request cost we do not use)."""

from __future__ import annotations

import gc
from pathlib import Path

import pytest
from fastapi import FastAPI

from protocol.asgi import freeze_startup_heap, without_native_telemetry


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


@pytest.mark.parametrize("entry", ["api/gateway/__main__.py", "key_broker/__main__.py",
                                   "enclave_worker/grpc_server.py"])
def test_every_roles_process_entry_point_freezes_before_it_serves(entry: str) -> None:
    source = (Path(__file__).resolve().parents[2] / entry).read_text()
    assert "freeze_startup_heap()" in source.split("def main(", 1)[1]
