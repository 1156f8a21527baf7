"""One machine: prepare the demo tenant and run key broker, worker and gateway as processes.

`sealed up` and the end-to-end tests both go through `prepare_demo` and `launch`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import functools
import hashlib
import json
import os
import secrets
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from api.broker_state import broker_measurement, demo_broker_instance, local_broker_keys
from api.console_settings import loopback_host
from api.home import Home, ed25519_key, write_public_key, x25519_key
from api.orchestrator.local import LocalRuntime
from api.orchestrator.loop import ControlLoop
from api.ports import free_port
from api.stack_children import on_free_ports, wait_http, worker_health
from api.stack_embedding import EMBEDDING_MODEL
from api.store.bootstrap import BOOTSTRAP_POLICIES, KEYS_FILE, ApiKeyStore, write_bootstrap_policy
from api.supervisor import RunLock, Supervisor
from api.tenant_audit import decision_key_public_hex
from api.tenant_tools import default_model_path, encrypt_model, write_pin
from api.vllm_python import vllm_python
from attestation.refvalues import sign_reference_values
from enclave_worker.measurement import simulated_measurement
from enclave_worker.settings import WorkerSettings
from key_broker.attested import instance_id
from key_broker.errors import KeyStoreError
from key_broker.keystore import DataKeyRegistry, LocalKeyStore
from key_broker.policies import PolicyStore
from key_broker.statefile import StateLedger, local_ledger
from policy.callers import api_key_digest
from policy.documents import sign_policy_document
from policy.release import ReleasePolicy
from policy.release_documents import invitation_acceptance, public_pem, sign_release_policy
from protocol.broker.tenancy import check_invitation, sign_invitation
from protocol.fsutil import atomic_write
from protocol.model_ref import ModelRef
from protocol.package import read_manifest
from protocol.package.signing import signer_identity
from protocol.sealed.hpke import api_key_id
from protocol.tls import load_or_create
from sealed_client.memory import ClientMemory

DEMO_TENANT = "demo"
DEMO_MODEL = "smollm2-135m-instruct"
DEMO_VERSION = "v1"
DEMO_ADMIN_KEY_ID = "demo-admin"  # the demo tenant's policy-admin key (data and release policies)


@dataclass(frozen=True)
class DemoInfo:
    api_key: str
    tenant: str
    model: str
    version: str
    package_dir: Path


def worker_settings(home: Home, broker_url: str, port: int, unsafe_sim_measurement: str | None = None,
                    engine: str = "sealed", model: str = DEMO_MODEL) -> WorkerSettings:
    """The demo worker (``model``: the demo's embedding model's, api/stack_embedding.py); it pins the
    local key broker's simulated measurement (measured config)."""
    return WorkerSettings(
        broker_url=broker_url, package_dir=home.package(DEMO_TENANT, model, DEMO_VERSION),
        tenant=DEMO_TENANT, model=model, version=DEMO_VERSION, tee="sim", sim_platform_key=home.sim_key,
        unsafe_sim_measurement=unsafe_sim_measurement, port=port,
        policy_file=home.tenant_policy(DEMO_TENANT), policy_admin_key=home.tenant_policy_admin_public(DEMO_TENANT),
        engine=engine, broker_tee="sim", broker_measurements=(broker_measurement(home).hex(),),
        # This broker instance (#46): a re-initialised broker (its state lost or rolled back) is refused.
        broker_instances=tuple(i for i in [demo_broker_instance(home)] if i),
    )


def prepare_demo(home: Home, model_path: Path | None = None, log: Callable[[str], None] = print,
                 engine: str = "sealed", embedding_model: Path | None = None, native_quant: bool = False) -> DemoInfo:
    """Idempotent: keys, the encrypted demo model, its data key, release policy and API key.
    ``native_quant``: a GGUF model's quantized linears kept in the engine's kernel layouts (as `sealed
    encrypt --gguf-quant native`), else dequantized to float32; a home's existing package is kept as is."""
    home.create()
    write_public_key(ed25519_key(home.sim_key), home.sim_public_key)
    tenant_key = ed25519_key(home.tenant_signing_key(DEMO_TENANT))
    # The broker's sealed master key, opened with the simulated platform key: only the simulated TEE
    # lets anything outside the broker do this (docs/security.md).
    master = local_broker_keys(home).master_key  # a new home: this initialises its broker (#46)
    ledger = local_ledger(home.broker, master)  # the broker refuses state files it has no record of
    keystore = LocalKeyStore(home.broker / "keystore", master, ledger)
    if not keystore.has_tenant_key(DEMO_TENANT):
        keystore.create_tenant_key(DEMO_TENANT)
    datakeys = DataKeyRegistry(home.broker / "keystore", keystore, ledger)
    pkg = home.package(DEMO_TENANT, DEMO_MODEL, DEMO_VERSION)
    demo = ModelRef(DEMO_TENANT, DEMO_MODEL, DEMO_VERSION)
    try:
        datakeys.get(demo)
        read_manifest(pkg)
    except (KeyStoreError, Exception):
        log(f"encrypting the demo model as tenant '{DEMO_TENANT}' into {pkg} ...")
        encrypted = encrypt_model(model_path or default_model_path(), pkg, tenant=DEMO_TENANT, model=DEMO_MODEL,
                                  version=DEMO_VERSION, signing_key=tenant_key, native_quant=native_quant)
        datakeys.register(demo, encrypted.data_key, encrypted.manifest.key_id,
                          encrypted.manifest.signer, encrypted.manifest.plaintext_digest)
    key_file = home.api_key_file(DEMO_TENANT)
    if not key_file.exists():
        secret = ApiKeyStore(home.gateway / KEYS_FILE).create(DEMO_TENANT, "demo")
        key_file.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        key_file.write_text(secret + "\n")
        key_file.chmod(0o600)
    api_key = key_file.read_text().strip()
    _write_demo_policy(home, api_key)
    _ensure_release_policy(home, ledger, tenant_signer=signer_identity(tenant_key.public_key()), engine=engine)
    if embedding_model is not None:  # `sealed up --embedding-model`: an encoder beside the chat model
        from api.stack_embedding import prepare_embedding

        prepare_embedding(home, ModelRef(DEMO_TENANT, EMBEDDING_MODEL, DEMO_VERSION), embedding_model, datakeys,
                          tenant_key, log)
        _ensure_release_policy(home, ledger, tenant_signer=signer_identity(tenant_key.public_key()),
                               model=EMBEDDING_MODEL)
    return DemoInfo(api_key, DEMO_TENANT, DEMO_MODEL, DEMO_VERSION, pkg)


# Tools the demo tenant keeps from its agents under any_tool: what its policy is there to show.
DEMO_DENIED_TOOLS = ("delete_files", "run_shell", "send_money")


def demo_policy_set(api_key: str, decision_record_key: str | None = None) -> dict:
    """The demo tenant's in-enclave controls: SSNs in prompts are refused, card numbers redacted,
    and the demo key may call any tool (agent frameworks name their tools freely: LangChain's
    structured output, the Agents SDK's handoffs) except DEMO_DENIED_TOOLS, at most 4 calls a
    request, with get_weather's arguments checked to be an object; decisions on sealed requests are sealed to
    `decision_record_key` (the tenant's X25519 key, hex). Its callers are the demo key alone (by
    digest): a key the operator makes for `demo` is refused (policy/callers.py)."""
    key_id = api_key_id(api_key)  # the gateway's id for this key
    sealed_records = {"decision_record_key": decision_record_key} if decision_record_key else {}
    return {**sealed_records,
        "policy_id": "demo-policy", "version": 1, "tenant": DEMO_TENANT,
        "callers": {"api_keys": [api_key_digest(api_key)]},
        "data": {"retention_days": 30, "pii_input": {"US_SSN": "block", "CREDIT_CARD": "redact"}},
        "agents": {key_id: {"tools": {"get_weather": {"args_schema": {"type": "object"}},
                                      **{name: {"denied": True} for name in DEMO_DENIED_TOOLS}}, "any_tool": True,
                            "max_calls_per_request": 4, "max_calls_per_session": 10_000}},
    }


def _write_demo_policy(home: Home, api_key: str) -> None:
    """Signed by the tenant's policy admin key, whose public half the worker's measurement pins."""
    admin = ed25519_key(home.tenant_policy_admin(DEMO_TENANT))
    write_public_key(admin, home.tenant_policy_admin_public(DEMO_TENANT))
    # The tenant's own key for its sealed decision records (`sealed audit decisions --key ...`).
    records = decision_key_public_hex(x25519_key(home.tenant_decision_record_key(DEMO_TENANT)))
    doc = sign_policy_document(demo_policy_set(api_key, records), admin, DEMO_ADMIN_KEY_ID)
    home.tenant_policy(DEMO_TENANT).write_text(json.dumps(doc, sort_keys=True))
    # The gateway enforces the same signed caller list for plaintext requests (it imports this file
    # at start, as it does the bootstrap key hashes; api/gateway/catalog.py).
    write_bootstrap_policy(home.gateway / BOOTSTRAP_POLICIES, DEMO_TENANT, doc, public_pem(admin.public_key()))


def _ensure_release_policy(home: Home, ledger: StateLedger, tenant_signer: str, engine: str = "sealed",
                           model: str = DEMO_MODEL) -> None:
    """Allow exactly this worker build's simulated measurement (with the engine `sealed up` runs);
    bump the version when it changes."""
    measurement = simulated_measurement(worker_settings(home, "", 0, engine=engine, model=model)
                                        .measured_config()).hex()
    store = PolicyStore(home.broker, ledger)
    try:
        current = store.get(ModelRef(DEMO_TENANT, model, DEMO_VERSION))  # the policy deciding its release
    except KeyStoreError:
        current = None
    if current is not None and current.allowed_measurements == frozenset({measurement}):
        return
    store_demo_release_policy(home, ledger, ReleasePolicy(
        policy_id="demo-release", version=1, tenant=DEMO_TENANT,
        model=model, allowed_tee=frozenset({"sim"}), allowed_measurements=frozenset({measurement}),
        required_signer=tenant_signer, unsafe_allow_simulated_tee=True,
    ))


def store_demo_release_policy(home: Home, ledger: StateLedger, policy: ReleasePolicy) -> ReleasePolicy:
    """The demo tenant signs ``policy`` with its policy-admin key (a tenant's file, local only in the
    one-machine demo) and the broker's store takes it; its version is moved above the stored one. The
    key is registered first (self-signed) if the broker has none for the tenant."""
    admin = ed25519_key(home.tenant_policy_admin(policy.tenant))
    store = PolicyStore(home.broker, ledger)
    if store.admin_keys.get(policy.tenant) is None:
        answer_demo_invitation(home, store, policy.tenant, admin)
    key_id = store.admin_keys.require(policy.tenant).key_id
    path_version = store.stored_version(policy.tenant, policy.model, policy.model_version)
    if path_version is not None and policy.version <= path_version:
        policy = dataclasses.replace(policy, version=path_version + 1)
    store.put(sign_release_policy(policy, admin, key_id))
    return policy


def answer_demo_invitation(home: Home, store: PolicyStore, tenant: str, admin: Ed25519PrivateKey) -> None:
    """The broker's invitation for ``tenant`` (issued here with the broker's instance key, which only
    the simulated TEE lets anything outside the broker hold), answered as the tenant would: checked
    under the instance key, signed by the tenant's policy-admin key; and the tenant's broker pin
    (`tenants/<tenant>/broker-pin.json`, a tenant's file) written for its CLI's checks (issue #46)."""
    keys = local_broker_keys(home)
    instance = instance_id(keys.instance_key.public_key())
    now = dt.datetime.now(dt.UTC)
    nonce, expires = store.admin_keys.invitations.issue(tenant, instance, now)
    invitation = check_invitation(sign_invitation(keys.instance_key, tenant, nonce, expires),
                                  instance_key=bytes.fromhex(instance), tenant=tenant, now=now)
    store.admin_keys.apply(tenant, invitation_acceptance(tenant, admin, DEMO_ADMIN_KEY_ID, invitation), now)
    sim_public = ed25519_key(home.sim_key).public_key().public_bytes(serialization.Encoding.Raw,
                                                                     serialization.PublicFormat.Raw)
    write_pin(home.root, tenant, {
        "tenant": tenant, "broker": {"tee": "sim", "measurements": [broker_measurement(home).hex()],
                                     "instances": [instance]},
        "evidence": {"sim_platform_key": sim_public.hex()}, "appraisal": {"unsafe_allow_simulated_tee": True},
        "policy_admin_public_key_pem": public_pem(admin.public_key())})


def _secret_file(path: Path) -> Path:
    """A random shared secret (worker registration, management JWT key), made once, 0600."""
    if not path.exists():
        atomic_write(path, secrets.token_urlsafe(48).encode())
    return path


@dataclass
class Stack:
    """The processes of one host, under one supervisor (restarts the one that dies; stops them all)."""

    home: Home
    gateway_url: str
    broker_url: str
    worker_url: str
    supervisor: Supervisor
    lock: RunLock | None = None
    loop: ControlLoop | None = None
    worker_urls: list[str] = field(default_factory=list)
    extra: dict[str, object] = field(default_factory=dict)  # written into run/pids.json

    @property
    def processes(self) -> list[subprocess.Popen]:
        """Broker and gateway (the current process of each)."""
        return [c.proc for n, c in self.supervisor.children.items() if n in ("key-broker", "gateway") and c.proc]

    @property
    def workers(self) -> list[subprocess.Popen]:
        return [c.proc for n, c in self.supervisor.children.items() if n.startswith("worker") and c.proc]

    def pid(self, name: str) -> int | None:
        child = self.supervisor.children.get(name)
        return child.pid if child else None

    def write_pids(self, *_: object) -> None:
        children = self.supervisor.children
        doc: dict[str, Any] = {name: child.pid for name, child in list(children.items())}
        doc.update({"supervisor": os.getpid(), "workers": [c.pid for n, c in list(children.items())
                                                          if n.startswith("worker")],
                    "broker_url": self.broker_url, "worker_url": self.worker_url,
                    "gateway_url": self.gateway_url, **self.extra})
        atomic_write(self.home.root / "run" / "pids.json", json.dumps(doc).encode())

    def stop(self, timeout: float = 10.0) -> None:
        if self.loop is not None:
            self.loop.stop()
        self.supervisor.stop(timeout)
        with contextlib.suppress(OSError):
            (self.home.root / "run" / "pids.json").unlink()
        if self.lock is not None:
            self.lock.release()

    def raise_if_failed(self) -> None:
        """Raise ChildFailed if a process cannot run as configured (the caller stops the stack)."""
        failure = self.supervisor.failed()
        if failure is not None:
            raise failure

    def wait_ready(self, timeout: float = 300.0) -> str:
        """Wait until the first worker is ready or failed; returns its final status."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.raise_if_failed()
            try:
                status: str = httpx.get(f"{self.worker_url}/internal/status", timeout=2.0).json()["status"]
                if status in ("ready", "failed"):
                    return status
            except (httpx.HTTPError, ValueError, KeyError):
                pass
            time.sleep(0.25)
        raise TimeoutError("worker did not become ready in time")

    def wait_answering(self, api_key: str, model: str, timeout: float = 120.0) -> None:
        """Wait until a client can be answered: the gateway lists the model (it does so only once a
        ready, attested worker is routed to) and a one-token completion through it succeeds."""
        deadline, headers = time.monotonic() + timeout, {"Authorization": f"Bearer {api_key}"}
        while time.monotonic() < deadline:
            self.raise_if_failed()
            try:
                listed = httpx.get(f"{self.gateway_url}/v1/models", headers=headers, timeout=5.0).json()
                if any(m.get("id") == model for m in listed.get("data", [])):
                    r = httpx.post(f"{self.gateway_url}/v1/completions", headers=headers, timeout=60.0,
                                   json={"model": model, "prompt": "Hello", "max_tokens": 1})
                    if r.status_code == 200:
                        return
            except (httpx.HTTPError, ValueError, AttributeError):
                pass
            time.sleep(0.25)
        raise TimeoutError("the gateway did not answer through the worker in time")


def gateway_client_cert(home: Home) -> Path:
    """The gateway's mTLS client certificate (made by whichever of gateway or stack comes first)."""
    load_or_create(home.gateway / "gateway-client.key", home.gateway / "gateway-client.pem")
    return home.gateway / "gateway-client.pem"


def worker_args(home: Home, broker_url: str, port: int, grpc_port: int, register_urls: list[str],
                unsafe_sim_measurement: str | None = None, engine: str = "sealed",
                model: str = DEMO_MODEL) -> list[str]:
    ws = worker_settings(home, broker_url, port, unsafe_sim_measurement, engine, model)
    args = ["enclave_worker.grpc_server", "--broker-url", broker_url, "--package-dir", str(ws.package_dir),
            "--tenant", ws.tenant, "--model", ws.model, "--version", ws.version, "--tee", ws.tee,
            "--sim-platform-key", str(home.sim_key), "--port", str(port), "--grpc-port", str(grpc_port),
            "--broker-tee", "sim", "--broker-measurement", ws.broker_measurements[0],
            "--register-token-file", str(_secret_file(home.gateway / "register-token")),
            "--gateway-client-cert", str(gateway_client_cert(home)),
            "--policy-file", str(ws.policy_file), "--policy-admin-key", str(ws.policy_admin_key),
            "--engine", ws.engine]
    for instance in ws.broker_instances:
        args += ["--broker-instance", instance]
    for url in register_urls:
        args += ["--register-url", url]
    if unsafe_sim_measurement:
        args += ["--unsafe-sim-measurement", unsafe_sim_measurement]
    return args


def write_demo_client_policy(home: Home, engine: str = "sealed", broker_url: str | None = None,
                             models: tuple[str, ...] = (DEMO_MODEL,)) -> Path:
    """`$SEALED_HOME/demo/client-policy.json`: what a sealed-mode client of the demo trusts (this
    build's simulated measurement and the broker's JWKS), for `SealedOpenAI(policy=...)`,
    `sealed verify --policy` and `sealed proxy --policy` (docs/sealed-mode.md)."""
    settings = worker_settings(home, "", 0, engine=engine)
    # Each served model's worker is measured with its model's name (the embedding model's engine is ours).
    measurements = [simulated_measurement(worker_settings(home, "", 0, engine=engine if m == DEMO_MODEL else "sealed",
                                                          model=m).measured_config()).hex() for m in models]
    # The operator publishes this build's measurement, signed; the client pins the publisher's key.
    (home.root / "publisher").mkdir(exist_ok=True, mode=0o700)
    publisher = ed25519_key(home.root / "publisher" / "reference-values.key")
    # The serial grows with every statement (the signing time in seconds): a client refuses one older
    # than the newest it has seen.
    now = dt.datetime.now(dt.UTC)
    home.reference_values.write_text(json.dumps(sign_reference_values(
        publisher, measurements, tee="sim", issued_at=now, valid_for=dt.timedelta(days=30),
        serial=int(now.timestamp()), promises=settings.promises()), indent=2))
    path = home.root / "demo" / "client-policy.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    # The client verifies the simulated TEE's reports itself, with the platform's public key: a file
    # of the operator's in this demo, which is exactly why the simulated TEE protects nothing.
    sim_public = ed25519_key(home.sim_key).public_key().public_bytes(serialization.Encoding.Raw,
                                                                     serialization.PublicFormat.Raw)
    # The tenant's own policy-admin key (its public half): a worker is accepted only if its key came under
    # a release policy this key signed, naming the worker's image (the publisher's statement only
    # corroborates). The client's memory of what it has seen lives next to the policy (client-state.json).
    admin_public = home.tenant_policy_admin_public(DEMO_TENANT)
    if not admin_public.exists():
        write_public_key(ed25519_key(home.tenant_policy_admin(DEMO_TENANT)), admin_public)
    ClientMemory.create(path.parent / "client-state.json")
    path.write_text(json.dumps({
        "tenant": DEMO_TENANT,
        "tenant_keys": [{"key_id": DEMO_ADMIN_KEY_ID, "public_key_pem": admin_public.read_text()}],
        "state_file": "client-state.json",
        "evidence": {"sim_platform_key": sim_public.hex()},
        "appraisal": {"allowed_tee": ["sim"], "allowed_measurements": [], "unsafe_allow_simulated_tee": True},
        "reference_values": {"publisher_key": publisher.public_key().public_bytes(
            serialization.Encoding.Raw, serialization.PublicFormat.Raw).hex()},
        # The key broker this demo's workers pin; a client asks it to attest itself (at `url`) and
        # takes its token keys from the attested identity, not from the broker's jwks.json on this
        # disk (`sealed verify --broker URL --policy ...` prints what it verified).
        "broker": {"tee": "sim", "measurements": list(settings.broker_measurements),
                   **({"url": broker_url} if broker_url else {})},
        **({} if broker_url else {"broker_jwks": json.loads((home.broker / "jwks.json").read_text())}),
        "require_promises": {"prompts_logged": False, "prefix_cache_isolation": "per-tenant-salt"},
    }, indent=2, sort_keys=True))
    return path


def broker_admin_token(home: Home) -> Path:
    """The operator's key-broker admin token (0600; the broker is given only its SHA-256)."""
    token = _secret_file(home.broker / "admin-token")
    digest = hashlib.sha256(token.read_text().strip().encode()).hexdigest()
    hashes = home.broker / "admin-token.sha256"
    if not hashes.exists() or hashes.read_text().strip() != digest:
        atomic_write(hashes, (digest + "\n").encode())
    return hashes


def console_cookie_args(host: str) -> list[str]:
    """On a loopback bind the console is reached over plain HTTP (http://127.0.0.1): its session
    cookie cannot be Secure there, and `sealed up` says so. Any other bind keeps it Secure."""
    return ["--unsafe-console-plain-http-loopback"] if loopback_host(host) else []


def launch(home: Home, *, host: str = "127.0.0.1", port: int = 8000,
           unsafe_sim_measurement: str | None = None, num_workers: int = 1,
           gateway_args: tuple[str, ...] = (), broker_args: tuple[str, ...] = (),
           worker_launcher: tuple[str, ...] = (), worker_extra_args: tuple[str, ...] = (),
           lock: RunLock | None = None, engine: str = "sealed", embedding_model: bool = False) -> Stack:
    """Start broker, gateway and workers under one supervisor; `lock` (the home's pid file) is
    taken here unless the caller holds it already.

    `worker_launcher` runs the worker through another module (e.g. one that installs fake TEE
    hardware, then calls the worker's main with the arguments after it); `worker_extra_args` come
    last, so they override the defaults (e.g. `--tee snp+nvgpu`)."""
    # A vLLM worker runs from vLLM's own virtualenv (api/vllm_python.py); found before anything starts.
    python = vllm_python() if engine == "vllm" else None
    lock = lock or RunLock(home.root / "run")
    local_gateway = f"http://127.0.0.1:{port}"  # workers register over loopback, whatever the public bind
    stack = Stack(home, f"http://{host}:{port}", "", "", Supervisor(home.logs), lock)
    try:
        def start_broker() -> str:
            broker_port = free_port()
            broker = stack.supervisor.start("key-broker", [
                "key_broker", "--data-dir", str(home.broker), "--port", str(broker_port),
                "--sim-platform-key", str(home.sim_public_key),
                # Its own (simulated) TEE: it attests itself and seals its keys with the platform key;
                # re-sealing lets a home outlive an upgrade of the broker's code (simulated TEE only).
                "--tee", "sim", "--sim-platform-signing-key", str(home.sim_key), "--unsafe-sim-reseal",
                "--admin-token-hash-file", str(broker_admin_token(home)),
                "--audit-witness", str(home.audit_witness), *broker_args], on_restart=stack.write_pids)
            wait_http(f"http://127.0.0.1:{broker_port}/healthz", broker)
            return f"http://127.0.0.1:{broker_port}"

        stack.broker_url = broker_url = on_free_ports(stack.supervisor, "key-broker", start_broker)
        models = (DEMO_MODEL, EMBEDDING_MODEL) if embedding_model else (DEMO_MODEL,)
        write_demo_client_policy(home, engine, broker_url, models)
        routes = home.gateway / "routes.json"
        routes.write_text(json.dumps([{"tenant": DEMO_TENANT, "model": m, "version": DEMO_VERSION} for m in models]))
        gateway_client_cert(home)  # made before the gateway and the workers start: no two processes race to make it
        gateway = stack.supervisor.start("gateway", [
            "api.gateway", "--data-dir", str(home.gateway), "--routes", str(routes), "--host", host,
            "--port", str(port), "--register-token-file", str(_secret_file(home.gateway / "register-token")),
            "--jwt-secret-file", str(_secret_file(home.gateway / "jwt-secret")),
            "--broker-jwks", str(home.broker / "jwks.json"), "--reference-values", str(home.reference_values),
            # The console (in the gateway) reads the audit logs and the broker's admin API, the latter
            # with each person's own broker token: the gateway is given no broker credential.
            "--audit-dir", str(home.audit), "--audit-witness", str(home.audit_witness), "--broker-url", broker_url,
            *console_cookie_args(host), *gateway_args],
            on_restart=stack.write_pids)
        # The workers start while the gateway does (it is waited for once they answer): a worker beats
        # until a gateway takes its heartbeat (enclave_worker/heartbeat.py), and its boot (imports,
        # attestation, key release, decryption, load) is most of a cold start.

        def start_worker(name: str, model: str = DEMO_MODEL) -> str:
            http_port, grpc_port = free_port(), free_port()
            encoder = model != DEMO_MODEL  # the embedding model: always our engine, from this virtualenv
            args = worker_args(home, broker_url, http_port, grpc_port, [local_gateway], unsafe_sim_measurement,
                               "sealed" if encoder else engine, model)
            if worker_launcher:
                args = [*worker_launcher, *args[1:]]  # the launcher calls the worker's main itself
            args += worker_extra_args
            url = f"http://127.0.0.1:{http_port}"
            child = stack.supervisor.start(name, args, on_restart=stack.write_pids, python=None if encoder else python,
                                           health=worker_health(url))
            wait_http(f"{url}/internal/status", child, timeout=120.0)
            return url

        for i in range(num_workers):
            name = "worker" if i == 0 else f"worker-{i}"
            stack.worker_urls.append(on_free_ports(stack.supervisor, name, functools.partial(start_worker, name)))
        stack.worker_url = stack.worker_urls[0]
        if embedding_model:
            on_free_ports(stack.supervisor, "embedding-worker",
                          functools.partial(start_worker, "embedding-worker", EMBEDDING_MODEL))
        wait_http(f"{local_gateway}/healthz", gateway)
        stack.supervisor.watch()
        # Every other registered model version gets its workers from the control loop.
        runtime = LocalRuntime(home, stack.supervisor, broker_url, local_gateway,
                               _secret_file(home.gateway / "register-token"), gateway_client_cert(home))
        runtime.on_change = stack.write_pids
        stack.loop = ControlLoop(runtime, local_gateway, home.gateway / "jwt-secret", home.broker / "admin-token",
                                 static=frozenset(ModelRef(DEMO_TENANT, m, DEMO_VERSION) for m in models))
        stack.loop.start()
        stack.write_pids()
    except BaseException:
        stack.stop()
        raise
    return stack
