"""The control loop on one host: poll the gateway's deployments, decide, start/stop workers, report.

Each step (every `interval_s`):
1. `GET /admin/v1/deployments` (operator token minted from the local management secret), and the
   key broker's record of each tenant's data keys (operator admin token);
2. per version: read its workers' own status; a worker that failed to boot (key refused,
   package rejected) is stopped and the version backs off (2 s doubling to 60 s) before the
   next try; a worker process that dies is restarted by the supervisor itself;
3. `reconcile.decide` -> how many workers; start the missing ones, drain the extra ones (the
   least loaded, once idle or after `drain_s`), all of a retired version's;
4. report the version's status to the gateway (`PUT /admin/v1/deployments/.../status`) when it
   changes, so `/readyz` says which version is failing and why.

Versions in `static` (the demo worker `sealed up` starts itself) are left alone.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from api.management.auth import issue_token
from api.orchestrator.local import LocalRuntime, LocalWorker
from api.orchestrator.reconcile import History, Inputs, decide
from api.orchestrator.scaling import ScalingPolicy, is_low
from api.orchestrator.spec import VersionSpec
from api.orchestrator.standby_pool import StandbyPool
from protocol.model_ref import ModelRef

log = logging.getLogger(__name__)
Key = ModelRef


@dataclass
class ControlLoop:
    runtime: LocalRuntime
    gateway_url: str
    jwt_secret_file: Path
    broker_token_file: Path
    static: frozenset[Key] = frozenset()
    interval_s: float = 1.0
    drain_s: float = 30.0
    policy: ScalingPolicy = field(default_factory=ScalingPolicy)
    standby: StandbyPool = field(default_factory=StandbyPool)  # warm pool: standby workers per version
    workers: dict[Key, list[LocalWorker]] = field(default_factory=dict)
    history: dict[Key, History] = field(default_factory=dict)
    reported: dict[Key, tuple[str, str]] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    # One client for the loop's life: a new one per call built an SSL context each time, most of the
    # 30 ms of CPU a second that an idle `sealed up` spent here (docs/retrieval.md "The cost of the boundary").
    _http: httpx.Client = field(default_factory=httpx.Client)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="control-loop", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
        self._http.close()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.step()
            except Exception as exc:  # the loop must outlive a gateway or broker restart
                log.warning("control loop step failed: %s", type(exc).__name__)

    # -- inputs
    def _token(self) -> str:
        return issue_token(self.jwt_secret_file.read_text().strip(), "control-loop", "operator", ttl_s=300)

    def _gateway(self, method: str, path: str, body: Any = None) -> Any:
        r = self._http.request(method, f"{self.gateway_url}/admin/v1{path}", json=body, timeout=5.0,
                          headers={"Authorization": f"Bearer {self._token()}"})
        r.raise_for_status()
        return r.json()

    def _broker_tenant(self, tenant: str) -> dict[str, Any] | None:
        token = self.broker_token_file.read_text().strip()
        try:
            r = self._http.get(f"{self.runtime.broker_url}/v1/admin/tenants/{tenant}", timeout=5.0,
                          headers={"Authorization": f"Bearer {token}"})
        except httpx.HTTPError:
            return None  # broker away: keep what runs, start nothing new for now
        return r.json() if r.status_code == 200 else {"has_key": False, "data_keys": []}

    def _tenant_policy(self, tenant: str) -> dict[str, Any] | None:
        try:
            return dict(self._gateway("GET", f"/tenants/{tenant}/policy"))
        except httpx.HTTPStatusError:
            return None

    # -- one step
    def step(self, now: float | None = None) -> None:
        specs = [VersionSpec.from_api(d) for d in self._gateway("GET", "/deployments")["data"]]
        specs = [s for s in specs if s.key not in self.static]
        brokers: dict[str, dict[str, Any] | None] = {}
        for spec in specs:
            if spec.tenant not in brokers:
                brokers[spec.tenant] = self._broker_tenant(spec.tenant)
            self._step_version(spec, brokers[spec.tenant], time.monotonic() if now is None else now)
        known = {s.key for s in specs}
        for key in [k for k in self.workers if k not in known]:  # deleted from the catalog
            for worker in self.workers.pop(key):
                self.runtime.stop(worker)
        for key in [k for k in self.standby.workers if k not in known]:
            self.standby.stop(self.runtime, key)

    def _step_version(self, spec: VersionSpec, broker: dict[str, Any] | None, now: float) -> None:
        key, history = spec.key, self.history.setdefault(spec.key, History())
        mine = self.workers.setdefault(key, [])
        for worker in list(mine):
            status = self.runtime.status(worker)
            if status.get("status") == "failed":
                delay = history.failed(str(status.get("reason") or "worker failed"), now)
                log.warning("worker for %s failed (%s); next try in %.0f s", spec.name, history.last_failure, delay)
                mine.remove(worker)
                self.runtime.stop(worker)
            elif status.get("status") == "ready":
                history.served()
        package_dir = self.runtime.package_dir(spec.key, spec.package)
        if broker is None:  # the key broker is away: change nothing
            return
        records = {(d["model"], d["version"]) for d in broker.get("data_keys", [])}
        inputs = Inputs(package=package_dir is not None, data_key=(spec.model, spec.version) in records,
                        key_revoked=bool(broker.get("revoked")))
        active = [w for w in mine if w.draining_since is None]
        history.low_since = (history.low_since or now) if is_low(spec, len(active), self.policy) else None
        decision = decide(spec, inputs, len(active), history, now, self.policy)
        if decision.want > len(active) and package_dir is not None:
            files = self.runtime.policy_files(spec.tenant, self._tenant_policy(spec.tenant))
            for _ in range(decision.want - len(active)):
                # A standby worker if one stands by (it attests afresh and loads), else a cold start.
                mine.append(self.standby.take(self.runtime, key) or self.runtime.start(key, package_dir, files))
                log.info("started a worker for %s", spec.name)
            history.low_since = None
        elif decision.want < len(active):
            loads = {w.get("pid"): float(w.get("load") or 0) for w in spec.registered_workers}
            extra = sorted(active, key=lambda w: loads.get(self.runtime.pid(w), 0.0))[: len(active) - decision.want]
            for worker in extra:
                worker.draining_since = now
            history.low_since = None
        for worker, since in [(w, w.draining_since) for w in mine if w.draining_since is not None]:
            load = next((float(w.get("load") or 0) for w in spec.registered_workers
                         if w.get("pid") == self.runtime.pid(worker)), 0.0)
            if load == 0 or now - since >= self.drain_s:
                mine.remove(worker)
                self.runtime.stop(worker)
                log.info("stopped a worker of %s (drained)", spec.name)
        self._tend_standby(spec, decision.status, package_dir, history, now)
        self._report(spec, decision.status, decision.reason)

    def _tend_standby(self, spec: VersionSpec, status: str, package_dir: Path | None, history: History,
                      now: float) -> None:
        """Keep the version's standby workers at the pool's size while it may run (scaled to zero
        included: that is where a standby worker saves the most); a failed one backs the version off."""
        if not self.standby.size and not self.standby.workers.get(spec.key):
            return
        may_run = not spec.retired and status in ("", "cold", "failing") and history.retry_at <= now
        files = lambda: self.runtime.policy_files(spec.tenant, self._tenant_policy(spec.tenant))  # noqa: E731
        for reason in self.standby.tend(self.runtime, spec.key, package_dir if may_run else None, files):
            delay = history.failed(reason, now)
            log.warning("standby worker for %s failed (%s); next try in %.0f s", spec.name, reason, delay)

    def _report(self, spec: VersionSpec, status: str, reason: str) -> None:
        if self.reported.get(spec.key) == (status, reason):
            return
        try:
            self._gateway("PUT", f"/deployments/{spec.tenant}/{spec.model}/{spec.version}/status",
                          {"status": status, "reason": reason})
            self.reported[spec.key] = (status, reason)
        except httpx.HTTPError:
            pass  # the gateway is restarting: report again next step

    def stop_all(self) -> None:
        self.standby.stop_all(self.runtime)
        for workers in self.workers.values():
            for worker in workers:
                self.runtime.stop(worker)
        self.workers.clear()
