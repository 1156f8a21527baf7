"""One host: workers as processes under the stack's supervisor (`api/supervisor.py`).

A worker for (tenant, model, version) reads the uploaded package from the gateway's package store
(or, for the demo, `$SEALED_HOME/packages/...`), attests to the local key broker with the simulated
TEE, and registers with the gateway by heartbeat. Its in-enclave policy is the tenant's signed
policy with the admin key stored in the control plane (both are part of the worker's measurement:
the control plane can choose them, but the tenant's release policy decides which measurement
gets a key); a tenant without one runs its workers with `--unsafe-no-tenant-policy`, which is
measured too, so the tenant must allow exactly that measurement.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from api.broker_state import broker_measurement
from api.home import Home
from api.ports import free_port
from api.supervisor import Supervisor
from enclave_worker.measurement import simulated_measurement
from enclave_worker.settings import WorkerSettings
from protocol.fsutil import atomic_write
from protocol.model_ref import ModelRef

_SAFE = re.compile(r"[^A-Za-z0-9._-]")


@dataclass(frozen=True)
class TenantPolicyFiles:
    policy_file: Path | None
    admin_key: Path | None

    @property
    def unsafe_none(self) -> bool:
        return self.policy_file is None or self.admin_key is None


def worker_settings(ref: ModelRef, package_dir: Path, files: TenantPolicyFiles, broker_url: str = "",
                    sim_platform_key: Path | None = None, port: int = 0,
                    broker_measurement: str | None = None) -> WorkerSettings:
    """The one place the local runtime's worker configuration is decided (its measurement follows);
    `broker_measurement`: the local (simulated) key broker's, which the worker pins."""
    return WorkerSettings(broker_url=broker_url, package_dir=package_dir, tenant=ref.tenant, model=ref.model,
                          version=ref.version, tee="sim", sim_platform_key=sim_platform_key, port=port,
                          policy_file=files.policy_file, policy_admin_key=files.admin_key,
                          unsafe_no_tenant_policy=files.unsafe_none,
                          broker_tee="sim" if broker_measurement else None,
                          broker_measurements=(broker_measurement,) if broker_measurement else ())


def local_measurement(ref: ModelRef, admin_key: Path | None, broker_measurement: str | None = None) -> str:
    """The simulated measurement of the local runtime's worker for this version (hex)."""
    files = TenantPolicyFiles(Path("policy.json") if admin_key else None, admin_key)
    settings = worker_settings(ref, Path("."), files, broker_measurement=broker_measurement)
    return simulated_measurement(settings.measured_config()).hex()


@dataclass
class LocalWorker:
    name: str  # the supervisor's child name
    key: ModelRef
    http_url: str
    started_at: float
    draining_since: float | None = None


class LocalRuntime:
    def __init__(self, home: Home, supervisor: Supervisor, broker_url: str, gateway_url: str,
                 register_token_file: Path, gateway_client_cert: Path) -> None:
        self.home, self.supervisor = home, supervisor
        self.broker_url, self.gateway_url = broker_url, gateway_url
        self.register_token_file, self.gateway_client_cert = register_token_file, gateway_client_cert
        self._seq = 0
        self.on_change: Callable[[], None] | None = None  # e.g. rewrite run/pids.json
        # The local key broker's simulated measurement: every worker started here pins it.
        self.broker_measurement = broker_measurement(home).hex()

    # -- where a version's inputs are
    def package_dir(self, ref: ModelRef, address: str | None) -> Path | None:
        if address:
            path = self.home.gateway / "package-store" / "packages" / address
            if (path / "manifest.json").exists():
                return path
        local = self.home.package(ref.tenant, ref.model, ref.version)
        return local if (local / "manifest.json").exists() else None

    def policy_files(self, tenant: str, policy: dict[str, Any] | None) -> TenantPolicyFiles:
        """The tenant's signed policy and admin key as files for `--policy-file`/`--policy-admin-key`."""
        if self.home.tenant_policy(tenant).exists() and self.home.tenant_policy_admin_public(tenant).exists():
            return TenantPolicyFiles(self.home.tenant_policy(tenant), self.home.tenant_policy_admin_public(tenant))
        if policy and policy.get("admin_key_pem") and policy.get("document"):
            base = self.home.root / "orchestrator" / "tenants" / _SAFE.sub("_", tenant)
            doc, key = base / "policy.json", base / "policy-admin.pub.pem"
            body = json.dumps(policy["document"], sort_keys=True).encode()
            if not doc.exists() or doc.read_bytes() != body:
                atomic_write(doc, body)
            if not key.exists() or key.read_text() != policy["admin_key_pem"]:
                atomic_write(key, str(policy["admin_key_pem"]).encode())
            return TenantPolicyFiles(doc, key)
        return TenantPolicyFiles(None, None)

    # -- processes
    def start(self, key: ModelRef, package_dir: Path, files: TenantPolicyFiles, standby: bool = False) -> LocalWorker:
        """A worker process for ``key``; ``standby``: it attests without a key and waits for ``assign``."""
        tenant, model, version = key.tenant, key.model, key.version
        http_port, grpc_port = free_port(), free_port()
        self._seq += 1
        name = "worker-" + _SAFE.sub("_", f"{tenant}-{model}-{version}") + f"-{self._seq}"
        ws = worker_settings(key, package_dir, files, self.broker_url, self.home.sim_key, http_port,
                             self.broker_measurement)
        args = ["enclave_worker.grpc_server", "--broker-url", self.broker_url, "--package-dir", str(package_dir),
                "--tenant", tenant, "--model", model, "--version", version, "--tee", "sim",
                "--broker-tee", "sim", "--broker-measurement", self.broker_measurement,
                "--sim-platform-key", str(self.home.sim_key), "--port", str(http_port),
                "--grpc-port", str(grpc_port), "--register-url", self.gateway_url,
                "--register-token-file", str(self.register_token_file),
                "--gateway-client-cert", str(self.gateway_client_cert)]
        if standby:
            args.append("--standby")
        if ws.unsafe_no_tenant_policy:
            args.append("--unsafe-no-tenant-policy")
        else:
            args += ["--policy-file", str(ws.policy_file), "--policy-admin-key", str(ws.policy_admin_key)]
        self.supervisor.start(name, args, on_restart=lambda _: self._changed())
        self._changed()
        return LocalWorker(name, key, f"http://127.0.0.1:{http_port}", time.monotonic())

    def stop(self, worker: LocalWorker) -> None:
        # The worker drains first (its streams in flight finish, up to its drain_s of 20 s).
        self.supervisor.remove(worker.name, timeout=25.0)
        self._changed()

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change()

    def status(self, worker: LocalWorker) -> dict[str, Any]:
        """The worker's own view (starting, ready, failed + reason); {} while it does not answer."""
        try:
            return dict(httpx.get(f"{worker.http_url}/internal/status", timeout=2.0).json())
        except (httpx.HTTPError, ValueError):
            return {}

    def assign(self, worker: LocalWorker) -> bool:
        """Tell a standby worker to boot (attest afresh, get the key, load); whether it took it."""
        try:
            return httpx.post(f"{worker.http_url}/internal/assign", timeout=5.0).status_code == 202
        except httpx.HTTPError:
            return False

    def pid(self, worker: LocalWorker) -> int | None:
        child = self.supervisor.children.get(worker.name)
        return child.pid if child else None
