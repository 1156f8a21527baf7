"""The control loop's decisions (pure), one loop step against a fake runtime and gateway, the local
runtime's measurement, and the management CLI's handling of secrets."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import typer

from api.orchestrator.local import LocalWorker, TenantPolicyFiles, local_measurement, worker_settings
from api.orchestrator.loop import ControlLoop
from api.orchestrator.reconcile import History, Inputs, decide
from api.orchestrator.scaling import ScalingPolicy, is_low, wanted_replicas
from api.orchestrator.spec import Load, VersionSpec
from enclave_worker.measurement import simulated_measurement
from protocol.model_ref import ModelRef

READY = Inputs(package=True, data_key=True)


def spec(**kw: Any) -> VersionSpec:
    return VersionSpec(**{"tenant": "acme", "model": "m", "version": "v1", **kw})


@pytest.mark.parametrize(("kw", "current", "want"), [
    ({"min_warm": 1, "max_replicas": 4}, 0, 1),  # the floor
    ({"min_warm": 2, "max_replicas": 4}, 0, 2),
    ({"min_warm": 0, "max_replicas": 4}, 0, 0),  # scaled to zero
    ({"min_warm": 0, "max_replicas": 4, "load": Load(unserved_recent=1)}, 0, 1),  # woken by a request
    ({"min_warm": 1, "max_replicas": 4, "load": Load(queue_depth=9)}, 1, 3),  # 4 per replica
    ({"min_warm": 1, "max_replicas": 2, "load": Load(queue_depth=40)}, 1, 2),  # the ceiling
    ({"min_warm": 1, "max_replicas": 4, "ttft_slo_ms": 500, "load": Load(queue_depth=2, ttft_ms=900)}, 1, 2),
    ({"min_warm": 1, "max_replicas": 4, "ttft_slo_ms": 500, "load": Load(queue_depth=0, ttft_ms=900)}, 1, 1),
    ({"retired": True, "min_warm": 3}, 2, 0),
])
def test_wanted_replicas(kw: dict, current: int, want: int) -> None:
    assert wanted_replicas(spec(**kw), current, None, now=0.0) == want


def test_scale_in_is_one_at_a_time_after_the_load_stayed_low() -> None:
    s, policy = spec(min_warm=0, max_replicas=4), ScalingPolicy(scale_in_after_s=60)
    assert is_low(s, 3, policy)
    assert wanted_replicas(s, 3, low_since=None, now=100.0, policy=policy) == 3
    assert wanted_replicas(s, 3, low_since=50.0, now=100.0, policy=policy) == 3
    assert wanted_replicas(s, 3, low_since=30.0, now=100.0, policy=policy) == 2
    assert not is_low(spec(min_warm=2, max_replicas=4), 2, policy)


def test_decide_waits_for_package_and_key_and_backs_off_after_failures() -> None:
    h = History()
    assert decide(spec(), Inputs(package=False, data_key=True), 0, h, 0).reason.startswith("no package")
    assert "no data key" in decide(spec(), Inputs(package=True, data_key=False), 0, h, 0).reason
    assert "revoked" in decide(spec(), Inputs(True, True, key_revoked=True), 0, h, 0).reason
    assert decide(spec(), READY, 0, h, 0).want == 1
    delays = [h.failed("key release refused by the key broker", now=0) for _ in range(7)]
    assert delays == [2, 4, 8, 16, 32, 60, 60]
    d = decide(spec(), READY, 0, h, now=10)
    assert (d.want, d.status) == (0, "failing") and "key release refused" in d.reason
    d = decide(spec(), READY, 0, h, now=61)  # the backoff is over: try again, still reported as failing
    assert (d.want, d.status) == (1, "failing")
    h.served()
    assert decide(spec(), READY, 1, h, now=62) == decide(spec(), READY, 1, History(), now=62)
    assert decide(spec(min_warm=0), READY, 0, History(), 0).status == "cold"
    assert decide(spec(retired=True), READY, 2, History(), 0).want == 0


class FakeRuntime:
    broker_url = "http://broker"

    def __init__(self) -> None:
        self.started: list[tuple[str, str, str]] = []
        self.stopped: list[str] = []
        self.statuses: dict[str, dict] = {}
        self.standby: list[str] = []  # started with --standby
        self.assigned: list[str] = []

    def package_dir(self, ref: ModelRef, address: str | None) -> Path | None:
        return Path("/pkg") if address else None

    def policy_files(self, tenant: str, policy: Any) -> TenantPolicyFiles:
        return TenantPolicyFiles(None, None)

    def start(self, key: ModelRef, package_dir: Path, files: TenantPolicyFiles, standby: bool = False
              ) -> LocalWorker:
        self.started.append(key)
        name = f"w{len(self.started)}"
        if standby:
            self.standby.append(name)
        return LocalWorker(name, key, "http://w", 0.0)

    def assign(self, worker: LocalWorker) -> bool:
        self.assigned.append(worker.name)
        return True

    def stop(self, worker: LocalWorker) -> None:
        self.stopped.append(worker.name)

    def status(self, worker: LocalWorker) -> dict:
        return self.statuses.get(worker.name, {"status": "starting"})

    def pid(self, worker: LocalWorker) -> int:
        return int(worker.name[1:])


class FakeLoop(ControlLoop):
    deployments: list[dict]
    broker: dict
    reports: list[tuple]

    def _gateway(self, method: str, path: str, body: Any = None) -> Any:
        if path == "/deployments":
            return {"data": self.deployments}
        self.reports.append((path, body))
        return {}

    def _broker_tenant(self, tenant: str) -> dict | None:
        return self.broker

    def _tenant_policy(self, tenant: str) -> dict | None:
        return None


def _loop(deployments: list[dict], broker: dict) -> tuple[FakeLoop, FakeRuntime]:
    runtime = FakeRuntime()
    loop = FakeLoop(runtime, "http://gw", Path("/nonexistent"), Path("/nonexistent"),  # type: ignore[arg-type]
                    static=frozenset({ModelRef("demo", "m", "v1")}))
    loop.deployments, loop.broker, loop.reports = deployments, broker, []
    return loop, runtime


ROW = {"tenant": "acme", "model": "m", "version": "v1", "min_warm": 1, "max_replicas": 2, "package": "ab" * 32}
KEYS = {"has_key": True, "revoked": False, "data_keys": [{"model": "m", "version": "v1"}]}


def test_a_registered_version_gets_a_worker_a_failed_one_is_replaced_after_backoff_retired_stops() -> None:
    loop, runtime = _loop([ROW, {**ROW, "tenant": "demo"}], KEYS)
    loop.step(now=0)
    assert runtime.started == [ModelRef("acme", "m", "v1")]  # the static demo version is left alone
    runtime.statuses["w1"] = {"status": "failed", "reason": "key release refused by the key broker"}
    loop.step(now=1)
    assert runtime.stopped == ["w1"] and len(runtime.started) == 1  # backing off
    assert loop.reports[-1][1]["status"] == "failing" and "key release refused" in loop.reports[-1][1]["reason"]
    loop.step(now=2.5)
    assert len(runtime.started) == 1
    loop.step(now=3.5)  # 2 s backoff over
    assert len(runtime.started) == 2
    loop.deployments = [{**ROW, "retired": True, "workers": [{"pid": 2, "load": 0}]}]
    loop.step(now=5)
    assert runtime.stopped == ["w1", "w2"]


def test_a_version_without_its_data_key_waits_and_says_why() -> None:
    loop, runtime = _loop([ROW], {"has_key": True, "data_keys": []})
    loop.step(now=0)
    assert runtime.started == []
    assert loop.reports == [("/deployments/acme/m/v1/status",
                             {"status": "waiting",
                              "reason": "no data key at the key broker (sealed models register --data-key)"})]
    loop.step(now=1)
    assert len(loop.reports) == 1  # reported on change only


def test_a_busy_worker_is_drained_before_it_is_stopped() -> None:
    loop, runtime = _loop([{**ROW, "max_replicas": 2, "load": {"queue_depth": 8}}], KEYS)
    loop.step(now=0)
    assert len(runtime.started) == 2
    busy = [{"pid": 1, "load": 3}, {"pid": 2, "load": 0}]
    loop.deployments = [{**ROW, "load": {"queue_depth": 0}, "workers": busy}]
    for t in range(0, 62):
        loop.step(now=1 + t)
    assert runtime.stopped == ["w2"]  # the idle one went first, after the load stayed low for 60 s


def test_local_measurement_is_the_one_the_launched_worker_has(tmp_path: Path) -> None:
    admin = tmp_path / "admin.pub.pem"
    admin.write_text("-----BEGIN PUBLIC KEY-----\nMCowBQYDK2VwAyEA" + "A" * 43 + "=\n-----END PUBLIC KEY-----\n")
    for key, files in ((None, TenantPolicyFiles(None, None)), (admin, TenantPolicyFiles(tmp_path / "p.json", admin))):
        launched = worker_settings(ModelRef("acme", "m", "v1"), tmp_path / "pkg", files, "http://broker", None, 9999)
        assert local_measurement(ModelRef("acme", "m", "v1"), key) == simulated_measurement(
            launched.measured_config()).hex()
    assert local_measurement(ModelRef("acme", "m", "v1"), None) != local_measurement(ModelRef("acme", "m", "v2"), None)


def test_cli_secrets_never_come_from_argv_and_credentials_are_private(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from api.cli import mgmt_client
    from api.cli.main import build

    monkeypatch.setenv("SEALED_HOME", str(tmp_path))
    monkeypatch.delenv("SEALED_MANAGEMENT_TOKEN", raising=False)
    runner = CliRunner()
    for group in ("login", "upload", "apikeys create", "tokens create"):
        text = runner.invoke(build(), [*group.split(), "--help"]).output
        assert "--token " not in text and "--secret" not in text and "--api-key" not in text, group
    monkeypatch.setenv("SEALED_MANAGEMENT_TOKEN", "from-env")
    assert mgmt_client.read_secret(None, "SEALED_MANAGEMENT_TOKEN", "t") == "from-env"
    (tmp_path / "t").write_text("from-file\n")
    assert mgmt_client.read_secret(tmp_path / "t", "SEALED_MANAGEMENT_TOKEN", "t") == "from-file"
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(typer.BadParameter):
        mgmt_client.read_secret(tmp_path / "empty", "SEALED_MANAGEMENT_TOKEN", "t")
    path = mgmt_client.save_profile("default", {"url": "http://x", "token": "t0"})
    assert path.stat().st_mode & 0o777 == 0o600
    os.chmod(path, 0o644)
    with pytest.raises(typer.BadParameter, match="chmod 600"):
        mgmt_client.load_profiles()
