"""One machine: prepare the demo tenant and run key broker, worker and gateway as processes.

`sealed up` and the end-to-end tests both go through `prepare_demo` and `launch`.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from api.gateway.keys import ApiKeyStore
from api.home import Home, ed25519_key, write_public_key
from api.proto.tls import load_or_create
from api.tenant_tools import default_model_path, encrypt_model
from enclave_worker.measurement import simulated_measurement
from enclave_worker.package import read_manifest
from enclave_worker.package.signing import signer_identity
from enclave_worker.settings import WorkerSettings
from key_broker.errors import KeyStoreError
from key_broker.fsutil import atomic_write
from key_broker.keystore import DataKeyRegistry, LocalKeyStore, load_master_key
from key_broker.policies import PolicyStore
from policy.documents import sign_policy_document
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
        policy_file=home.tenant_policy(DEMO_TENANT), policy_admin_key=home.tenant_policy_admin_public(DEMO_TENANT),
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
                          encrypted.manifest.signer, encrypted.manifest.plaintext_digest)
    key_file = home.api_key_file(DEMO_TENANT)
    if not key_file.exists():
        secret = ApiKeyStore(home.gateway / "api-keys.json").create(DEMO_TENANT, "demo")
        key_file.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        key_file.write_text(secret + "\n")
        key_file.chmod(0o600)
    api_key = key_file.read_text().strip()
    _write_demo_policy(home, api_key)
    _ensure_release_policy(home, tenant_signer=signer_identity(tenant_key.public_key()))
    return DemoInfo(api_key, DEMO_TENANT, DEMO_MODEL, DEMO_VERSION, pkg)


def demo_policy_set(api_key: str) -> dict:
    """The demo tenant's in-enclave controls: SSNs in prompts are refused, card numbers redacted,
    and the demo key may call one tool, get_weather, with an object of arguments."""
    key_id = f"key_{hashlib.sha256(api_key.encode()).hexdigest()[:16]}"  # the gateway's id for this key
    return {
        "policy_id": "demo-policy", "version": 1, "tenant": DEMO_TENANT,
        "data": {"retention_days": 30, "pii_input": {"US_SSN": "block", "CREDIT_CARD": "redact"}},
        "agents": {key_id: {"tools": {"get_weather": {"args_schema": {"type": "object"}}},
                            "max_calls_per_request": 4, "max_calls_per_session": 10_000}},
    }


def _write_demo_policy(home: Home, api_key: str) -> None:
    """Signed by the tenant's policy admin key, whose public half the worker's measurement pins."""
    admin = ed25519_key(home.tenant_policy_admin(DEMO_TENANT))
    write_public_key(admin, home.tenant_policy_admin_public(DEMO_TENANT))
    doc = sign_policy_document(demo_policy_set(api_key), admin, "demo-admin")
    home.tenant_policy(DEMO_TENANT).write_text(json.dumps(doc, sort_keys=True))


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


def _secret_file(path: Path) -> Path:
    """A random shared secret (worker registration, management JWT key), made once, 0600."""
    if not path.exists():
        atomic_write(path, secrets.token_urlsafe(48).encode())
    return path


@dataclass
class Stack:
    home: Home
    gateway_url: str
    broker_url: str
    worker_url: str
    processes: list[subprocess.Popen] = field(default_factory=list)
    # Workers are supervised apart from `processes`: one dying is replaced, it does not stop the stack.
    workers: list[subprocess.Popen] = field(default_factory=list)
    worker_urls: list[str] = field(default_factory=list)
    _respawn: list[list[str]] = field(default_factory=list)
    _stopping: threading.Event = field(default_factory=threading.Event)

    def stop(self, timeout: float = 10.0) -> None:
        self._stopping.set()
        every = [*self.workers, *self.processes]
        for proc in reversed(every):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for proc in every:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def keep_warm(self, interval: float = 1.0) -> None:
        """Replace workers that exited (the minimum of warm workers per model), until stop()."""
        while not self._stopping.wait(interval):
            for i, proc in enumerate(self.workers):
                if proc.poll() is not None and not self._stopping.is_set():
                    self.workers[i] = _spawn(self.home, f"worker-{i}", self._respawn[i])

    def wait_ready(self, timeout: float = 300.0) -> str:
        """Wait until the first worker is ready or failed; returns its final status."""
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


def gateway_client_cert(home: Home) -> Path:
    """The gateway's mTLS client certificate (made by whichever of gateway or stack comes first)."""
    load_or_create(home.gateway / "gateway-client.key", home.gateway / "gateway-client.pem")
    return home.gateway / "gateway-client.pem"


def worker_args(home: Home, broker_url: str, port: int, grpc_port: int, register_urls: list[str],
                unsafe_sim_measurement: str | None = None) -> list[str]:
    ws = worker_settings(home, broker_url, port, unsafe_sim_measurement)
    args = ["enclave_worker.grpc_server", "--broker-url", broker_url, "--package-dir", str(ws.package_dir),
            "--tenant", ws.tenant, "--model", ws.model, "--version", ws.version, "--tee", ws.tee,
            "--sim-platform-key", str(home.sim_key), "--port", str(port), "--grpc-port", str(grpc_port),
            "--register-token-file", str(_secret_file(home.gateway / "register-token")),
            "--gateway-client-cert", str(gateway_client_cert(home)),
            "--policy-file", str(ws.policy_file), "--policy-admin-key", str(ws.policy_admin_key)]
    for url in register_urls:
        args += ["--register-url", url]
    if unsafe_sim_measurement:
        args += ["--unsafe-sim-measurement", unsafe_sim_measurement]
    return args


def launch(home: Home, *, host: str = "127.0.0.1", port: int = 8000,
           unsafe_sim_measurement: str | None = None, num_workers: int = 1,
           gateway_args: tuple[str, ...] = ()) -> Stack:
    broker_port = free_port()
    broker_url = f"http://127.0.0.1:{broker_port}"
    local_gateway = f"http://127.0.0.1:{port}"  # workers register over loopback, whatever the public bind
    worker_ports = [(free_port(), free_port()) for _ in range(num_workers)]
    stack = Stack(home, f"http://{host}:{port}", broker_url, f"http://127.0.0.1:{worker_ports[0][0]}")
    try:
        # The console (in the gateway) reaches the broker's admin API with an operator token of its own.
        console_token = _secret_file(home.gateway / "broker-admin-token")
        atomic_write(home.broker / "admin-token.sha256",
                     (hashlib.sha256(console_token.read_bytes().strip()).hexdigest() + "\n").encode())
        broker = _spawn(home, "key-broker", ["key_broker", "--data-dir", str(home.broker), "--port",
                                             str(broker_port), "--sim-platform-key", str(home.sim_public_key),
                                             "--admin-token-hash-file", str(home.broker / "admin-token.sha256")])
        stack.processes.append(broker)
        _wait_http(f"{broker_url}/healthz", broker)
        routes = home.gateway / "routes.json"
        routes.write_text(json.dumps([{"tenant": DEMO_TENANT, "model": DEMO_MODEL, "version": DEMO_VERSION}]))
        gateway = _spawn(home, "gateway", [
            "api.gateway", "--data-dir", str(home.gateway), "--routes", str(routes), "--host", host,
            "--port", str(port), "--register-token-file", str(_secret_file(home.gateway / "register-token")),
            "--jwt-secret-file", str(_secret_file(home.gateway / "jwt-secret")),
            "--broker-jwks", str(home.broker / "jwks.json"), "--audit-dir", str(home.audit),
            "--broker-url", broker_url, "--broker-admin-token-file", str(console_token), *gateway_args])
        stack.processes.append(gateway)
        _wait_http(f"{local_gateway}/healthz", gateway)
        for i, (http_port, grpc_port) in enumerate(worker_ports):
            args = worker_args(home, broker_url, http_port, grpc_port, [local_gateway], unsafe_sim_measurement)
            stack._respawn.append(args)
            stack.workers.append(_spawn(home, "worker" if i == 0 else f"worker-{i}", args))
            stack.worker_urls.append(f"http://127.0.0.1:{http_port}")
        _wait_http(f"{stack.worker_url}/internal/status", stack.workers[0])
        threading.Thread(target=stack.keep_warm, name="keep-warm", daemon=True).start()
        (home.root / "run").mkdir(exist_ok=True, mode=0o700)
        (home.root / "run" / "pids.json").write_text(json.dumps({
            "key-broker": broker.pid, "worker": stack.workers[0].pid, "gateway": gateway.pid,
            "workers": [w.pid for w in stack.workers], "broker_url": broker_url,
            "worker_url": stack.worker_url}))
    except BaseException:
        stack.stop()
        raise
    return stack
