"""One machine: prepare the demo tenant and run key broker, worker and gateway as processes.

`sealed up` and the end-to-end tests both go through `prepare_demo` and `launch`.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from api.gateway.keys import ApiKeyStore
from api.home import Home, ed25519_key, write_public_key
from api.tenant_tools import default_model_path, encrypt_model
from enclave_worker.measurement import simulated_measurement
from enclave_worker.package import read_manifest
from enclave_worker.package.signing import signer_identity
from enclave_worker.settings import WorkerSettings
from key_broker.errors import KeyStoreError
from key_broker.keystore import DataKeyRegistry, LocalKeyStore, load_master_key
from key_broker.policies import PolicyStore
from policy.release import ReleasePolicy

DEMO_TENANT = "demo"
DEMO_MODEL = "smollm2-135m-instruct"
DEMO_VERSION = "v1"


@dataclass(frozen=True)
class DemoInfo:
    api_key: str
    tenant: str
    model: str
    version: str
    package_dir: Path


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def worker_settings(home: Home, broker_url: str, port: int, unsafe_sim_measurement: str | None = None
                    ) -> WorkerSettings:
    return WorkerSettings(
        broker_url=broker_url, package_dir=home.package(DEMO_TENANT, DEMO_MODEL, DEMO_VERSION),
        tenant=DEMO_TENANT, model=DEMO_MODEL, version=DEMO_VERSION, tee="sim", sim_platform_key=home.sim_key,
        unsafe_sim_measurement=unsafe_sim_measurement, port=port,
    )


def prepare_demo(home: Home, model_path: Path | None = None, log: callable = print) -> DemoInfo:  # type: ignore[valid-type]
    """Idempotent: keys, the encrypted demo model, its data key, release policy and API key."""
    home.create()
    write_public_key(ed25519_key(home.sim_key), home.sim_public_key)
    tenant_key = ed25519_key(home.tenant_signing_key(DEMO_TENANT))
    keystore = LocalKeyStore(home.broker / "keystore", load_master_key(home.broker / "master.key"))
    if not keystore.has_tenant_key(DEMO_TENANT):
        keystore.create_tenant_key(DEMO_TENANT)
    datakeys = DataKeyRegistry(home.broker / "keystore", keystore)
    pkg = home.package(DEMO_TENANT, DEMO_MODEL, DEMO_VERSION)
    try:
        datakeys.get(DEMO_TENANT, DEMO_MODEL, DEMO_VERSION)
        read_manifest(pkg)
    except (KeyStoreError, Exception):
        log(f"encrypting the demo model as tenant '{DEMO_TENANT}' into {pkg} ...")
        encrypted = encrypt_model(model_path or default_model_path(), pkg, tenant=DEMO_TENANT, model=DEMO_MODEL,
                                  version=DEMO_VERSION, signing_key=tenant_key)
        datakeys.register(DEMO_TENANT, DEMO_MODEL, DEMO_VERSION, encrypted.data_key, encrypted.manifest.key_id,
                          encrypted.manifest.signer, encrypted.manifest.plaintext_sha256)
    _ensure_release_policy(home, tenant_signer=signer_identity(tenant_key.public_key()))
    key_file = home.api_key_file(DEMO_TENANT)
    if not key_file.exists():
        secret = ApiKeyStore(home.gateway / "api-keys.json").create(DEMO_TENANT, "demo")
        key_file.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        key_file.write_text(secret + "\n")
        key_file.chmod(0o600)
    return DemoInfo(key_file.read_text().strip(), DEMO_TENANT, DEMO_MODEL, DEMO_VERSION, pkg)


def _ensure_release_policy(home: Home, tenant_signer: str) -> None:
    """Allow exactly this worker build's simulated measurement; bump the version when it changes."""
    measurement = simulated_measurement(worker_settings(home, "", 0).measured_config()).hex()
    store = PolicyStore(home.broker)
    try:
        current = store.get(DEMO_TENANT, DEMO_MODEL)
    except KeyStoreError:
        current = None
    if current is not None and current.allowed_measurements == frozenset({measurement}):
        return
    store.put(ReleasePolicy(
        policy_id="demo-release", version=(current.version + 1) if current else 1, tenant=DEMO_TENANT,
        model=DEMO_MODEL, allowed_tee=frozenset({"sim"}), allowed_measurements=frozenset({measurement}),
        required_signer=tenant_signer, unsafe_allow_simulated_tee=True,
    ))


@dataclass
class Stack:
    home: Home
    gateway_url: str
    broker_url: str
    worker_url: str
    processes: list[subprocess.Popen] = field(default_factory=list)

    def stop(self, timeout: float = 10.0) -> None:
        for proc in reversed(self.processes):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for proc in self.processes:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def wait_ready(self, timeout: float = 300.0) -> str:
        """Wait until the worker is ready or failed; returns its final status."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for proc in self.processes:
                if proc.poll() is not None:
                    raise RuntimeError(f"process {proc.args!r} exited with {proc.returncode}")
            try:
                status = httpx.get(f"{self.worker_url}/internal/status", timeout=2.0).json()["status"]
                if status in ("ready", "failed"):
                    return status
            except (httpx.HTTPError, ValueError, KeyError):
                pass
            time.sleep(0.25)
        raise TimeoutError("worker did not become ready in time")


def _spawn(home: Home, name: str, args: list[str]) -> subprocess.Popen:
    log = open(home.logs / f"{name}.log", "ab")  # noqa: SIM115 (owned by the child for its lifetime)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, "-m", *args], stdout=log, stderr=subprocess.STDOUT, env=env,
                            start_new_session=True)


def _wait_http(url: str, proc: subprocess.Popen, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args!r} exited with {proc.returncode}")
        try:
            if httpx.get(url, timeout=1.0).status_code < 500:
                return
        except httpx.HTTPError:
            time.sleep(0.1)
    raise TimeoutError(f"{url} did not come up")


def launch(home: Home, *, host: str = "127.0.0.1", port: int = 8000,
           unsafe_sim_measurement: str | None = None) -> Stack:
    broker_port, worker_port = free_port(), free_port()
    broker_url, worker_url = f"http://127.0.0.1:{broker_port}", f"http://127.0.0.1:{worker_port}"
    stack = Stack(home, f"http://{host}:{port}", broker_url, worker_url)
    try:
        broker = _spawn(home, "key-broker", ["key_broker", "--data-dir", str(home.broker), "--port",
                                             str(broker_port), "--sim-platform-key", str(home.sim_public_key)])
        stack.processes.append(broker)
        _wait_http(f"{broker_url}/healthz", broker)
        ws = worker_settings(home, broker_url, worker_port, unsafe_sim_measurement)
        worker_args = ["enclave_worker", "--broker-url", broker_url, "--package-dir", str(ws.package_dir),
                       "--tenant", ws.tenant, "--model", ws.model, "--version", ws.version, "--tee", ws.tee,
                       "--sim-platform-key", str(home.sim_key), "--port", str(worker_port)]
        if unsafe_sim_measurement:
            worker_args += ["--unsafe-sim-measurement", unsafe_sim_measurement]
        worker = _spawn(home, "worker", worker_args)
        stack.processes.append(worker)
        routes = home.gateway / "routes.json"
        routes.write_text(json.dumps([{"url": worker_url, "tenant": ws.tenant, "model": ws.model,
                                       "version": ws.version}]))
        gateway = _spawn(home, "gateway", ["api.gateway", "--data-dir", str(home.gateway), "--routes",
                                           str(routes), "--host", host, "--port", str(port)])
        stack.processes.append(gateway)
        _wait_http(f"{stack.gateway_url}/healthz", gateway)
        _wait_http(f"{worker_url}/internal/status", worker)
        (home.root / "run").mkdir(exist_ok=True, mode=0o700)
        (home.root / "run" / "pids.json").write_text(json.dumps({
            "key-broker": broker.pid, "worker": worker.pid, "gateway": gateway.pid,
            "broker_url": broker_url, "worker_url": worker_url}))
    except BaseException:
        stack.stop()
        raise
    return stack
