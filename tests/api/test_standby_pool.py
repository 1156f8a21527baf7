"""Warm pools in the control loop (api/orchestrator/standby_pool.py): standby workers per version, assigned
instead of a cold start and replaced; none for a version that may not run; a failed one backs off."""

from __future__ import annotations

import pytest

from api.orchestrator.standby_pool import StandbyPool
from protocol.model_ref import ModelRef
from tests.api.test_orchestrator import KEYS, ROW, _loop

ACME = ModelRef("acme", "m", "v1")


def test_the_pool_stands_by_and_a_wanted_worker_is_a_standby_one_assigned_then_replaced() -> None:
    loop, runtime = _loop([{**ROW, "min_warm": 0}], KEYS)  # scaled to zero: no serving worker wanted
    loop.standby = StandbyPool(size=2)
    loop.step(now=0)
    assert runtime.standby == ["w1", "w2"] and runtime.assigned == []
    loop.step(now=1)
    assert len(runtime.started) == 2  # the pool is full: nothing more
    runtime.statuses.update({"w1": {"status": "starting"}, "w2": {"status": "standby"}})
    loop.deployments = [{**ROW, "min_warm": 0, "load": {"unserved_recent": 1}}]  # a request woke it
    loop.step(now=2)
    assert runtime.assigned == ["w2"]  # the one that stands by (w1 is still attesting)
    assert [w.name for w in loop.workers[ACME]] == ["w2"]
    assert runtime.standby == ["w1", "w2", "w3"]  # w2's place taken by a new standby worker
    assert [w.name for w in loop.standby.workers[ACME]] == ["w1", "w3"]
    assert runtime.stopped == []


def test_without_a_standby_worker_the_start_is_cold() -> None:
    loop, runtime = _loop([ROW], KEYS)
    loop.standby = StandbyPool(size=1)
    loop.step(now=0)  # the pool's worker is only starting: the wanted worker starts cold beside it
    assert runtime.assigned == [] and len(runtime.started) == 2
    assert [w.name for w in loop.workers[ACME]] == ["w1"] and runtime.standby == ["w2"]


def test_no_standby_worker_for_a_version_without_its_data_key_and_none_after_retirement() -> None:
    loop, runtime = _loop([ROW], {"has_key": True, "data_keys": []})
    loop.standby = StandbyPool(size=1)
    loop.step(now=0)
    assert runtime.started == []
    loop.broker = KEYS
    loop.step(now=1)
    assert runtime.standby == ["w2"]
    loop.deployments = [{**ROW, "retired": True}]
    loop.step(now=2)
    assert "w2" in runtime.stopped and ACME not in loop.standby.workers


def test_a_failed_standby_worker_is_stopped_and_backs_the_version_off() -> None:
    loop, runtime = _loop([{**ROW, "min_warm": 0}], KEYS)
    loop.standby = StandbyPool(size=1)
    loop.step(now=0)
    runtime.statuses["w1"] = {"status": "failed", "reason": "attestation failed in the TEE"}
    loop.step(now=1)
    assert runtime.stopped == ["w1"] and len(runtime.started) == 1  # no new one during the backoff
    assert loop.history[ACME].failures == 1 and "attestation failed" in loop.history[ACME].last_failure
    loop.step(now=2)
    assert len(runtime.started) == 1
    loop.step(now=3.5)  # the 2 s backoff is over
    assert runtime.standby == ["w1", "w2"]


def test_a_deleted_version_and_stop_all_stop_its_standby_workers() -> None:
    loop, runtime = _loop([{**ROW, "min_warm": 0}], KEYS)
    loop.standby = StandbyPool(size=1)
    loop.step(now=0)
    loop.deployments = []
    loop.step(now=1)
    assert runtime.stopped == ["w1"]
    loop.deployments = [{**ROW, "min_warm": 0}]
    loop.step(now=2)
    loop.stop_all()
    assert runtime.stopped == ["w1", "w2"] and loop.standby.workers == {}


def test_a_negative_pool_size_is_refused() -> None:
    with pytest.raises(ValueError, match="standby pool size"):
        StandbyPool(size=-1)


def _version_state(statuses: list[str]) -> dict:
    from types import SimpleNamespace

    from api.gateway.internal import version_state

    workers = [SimpleNamespace(status=s, reason="") for s in statuses]
    registry = SimpleNamespace(for_version=lambda ref: workers, routable=lambda w: w.status == "ready")
    row = SimpleNamespace(tenant="acme", model="m", version="v1", min_warm=0, max_replicas=2, status="",
                          status_reason="")
    return version_state(SimpleNamespace(registry=registry), row)  # type: ignore[arg-type]


def test_the_gateway_says_cold_not_failing_for_a_version_with_only_standby_workers() -> None:
    standby = _version_state(["standby", "standby"])
    assert (standby["state"], standby["warm"]) == ("cold", 0) and "standby" in standby["reason"]
    assert _version_state(["standby", "failed"])["state"] == "failing"  # one failed: not all standby
    assert _version_state(["standby", "ready"])["state"] == "ready"
