"""The worker's state and life: `WorkerState` is built once (frozen), `LiveState` changes only through its
methods, the boot runs outside the HTTP app, and the app is a view that starts nothing."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from enclave_worker import lifecycle
from enclave_worker.lifecycle import boot_and_serve, startup_guard
from enclave_worker.server import create_app
from enclave_worker.settings import WorkerSettings
from enclave_worker.state import LiveState, WorkerState
from protocol.broker.errors import BrokerRefused


@dataclasses.dataclass
class FakeBooted:
    """The booted model's seam: what the lifecycle calls on it."""

    wiped: bool = False

    def wipe(self) -> None:
        self.wiped = True


def _settings(tmp_path: Path, **kw: Any) -> WorkerSettings:
    return WorkerSettings(broker_url="http://127.0.0.1:9", package_dir=tmp_path, tenant="acme", model="m",
                          version="v1", **kw)


def test_the_state_is_frozen_and_only_its_live_part_changes(tmp_path: Path) -> None:
    state = WorkerState(_settings(tmp_path, unsafe_no_tenant_policy=True))
    for name, value in (("guard", None), ("settings", state.settings), ("live", LiveState())):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(state, name, value)
    with pytest.raises(AttributeError):
        state.booted = FakeBooted()  # type: ignore[misc]  # read-only: the live part holds the model
    assert state.records is state.records and state.signer is state.signer  # one per process
    # The channel binding the evidence carries covers this process's own TLS and usage keys.
    assert state.channel_binding != WorkerState(state.settings, tls_spki=b"other").channel_binding


def test_live_state_moves_only_along_the_lifecycle() -> None:
    live, booted, other = LiveState(), FakeBooted(), FakeBooted()
    assert not live.drain()  # nothing to drain while starting
    assert live.ready(booted) and live.status == "ready" and live.booted is booted
    assert not live.ready(other) and live.booted is booted  # ready once
    live.renewed(other, FakeBooted())  # type: ignore[arg-type]  # a renewal of a model no longer served
    assert live.booted is booted
    assert live.drain() and live.status == "draining" and not live.drain()
    assert live.fail("why") is booted and (live.status, live.reason, live.booted) == ("failed", "why", None)
    assert not live.ready(other)  # a failed worker never serves again in this process


def test_a_tenant_policy_that_cannot_be_read_fails_at_startup(tmp_path: Path) -> None:
    assert startup_guard(_settings(tmp_path)) == (None, "tenant policy or package metadata invalid")  # none given
    missing = _settings(tmp_path, policy_file=tmp_path / "absent.json", policy_admin_key=tmp_path / "absent.pub")
    assert startup_guard(missing) == (None, "package or policy file missing")
    guard, reason = startup_guard(_settings(tmp_path, unsafe_no_tenant_policy=True))
    assert guard is not None and guard.policy_set is None and reason == ""


def test_a_worker_that_failed_at_startup_never_boots(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lifecycle, "boot", lambda *a: pytest.fail("booted a worker that failed its startup checks"))
    state = WorkerState(_settings(tmp_path), live=LiveState(status="failed", reason="package or policy file missing"))
    asyncio.run(boot_and_serve(state))
    assert (state.live.status, state.live.reason, state.booted) == ("failed", "package or policy file missing", None)


def test_a_refused_key_release_is_a_failed_worker_with_a_fixed_reason(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    def refused(*_: object) -> None:
        raise BrokerRefused("release policy: measurement 1234 not allowed (details for the audit log only)")

    monkeypatch.setattr(lifecycle, "boot", refused)
    state = WorkerState(_settings(tmp_path, unsafe_no_tenant_policy=True))
    asyncio.run(boot_and_serve(state))
    assert (state.live.status, state.live.reason) == ("failed", "key release refused by the key broker")
    assert state.booted is None


def test_a_model_booted_after_the_worker_stopped_is_wiped_not_served(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    booted = FakeBooted()
    state = WorkerState(_settings(tmp_path, unsafe_no_tenant_policy=True))

    def boot_while_failing(*_: object) -> FakeBooted:
        state.live.fail("data key revoked or its lease ran out")  # as a revocation racing the boot would
        return booted

    monkeypatch.setattr(lifecycle, "boot", boot_while_failing)
    asyncio.run(boot_and_serve(state))
    assert booted.wiped and state.booted is None and state.live.status == "failed"


def test_the_status_app_is_a_view_that_boots_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lifecycle, "boot", lambda *a: pytest.fail("the HTTP app booted the worker"))
    state = WorkerState(_settings(tmp_path, unsafe_no_tenant_policy=True))
    with TestClient(create_app(state)) as client:  # with its lifespan: still nothing boots
        assert client.get("/internal/readyz").status_code == 503
        assert client.get("/internal/attestation").status_code == 503
        status = client.get("/internal/status").json()
        assert status["status"] == "starting" and status["kernel_path"] == state.settings.kernel_path
        assert status["kernel_path"].startswith("cpu/")  # the measured configuration's kernel path
        state.live.fail("key broker unreachable")
        assert client.get("/internal/readyz").json() == {"status": "failed", "reason": "key broker unreachable"}
