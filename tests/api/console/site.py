"""A console site for the tests: a real key broker and a real gateway (uvicorn, localhost), with
two tenants' keys, releases, refusals, audit entries from three components, usage, policies and
workers, so every page has data and every tenant has rows the other must never see."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import re
import secrets
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from fastapi import FastAPI

from api.app import build_gateway, create_app
from api.console_settings import ConsoleSettings
from api.gateway.settings import GatewaySettings
from api.management.auth import issue_token
from api.stack import free_port
from policy.audit import AuditLog
from policy.documents import sign_policy_document
from protocol.heartbeat import heartbeat_signing_input, worker_id_for
from protocol.model_ref import ModelRef
from tests.api.signed_usage import signed_row
from tests.key_broker.conftest import Harness

TENANTS = ("acme", "globex")
# Strings that must never appear in any page or export (the scan test looks for each).
PROMPT = "PROMPT-CANARY-do-not-log-7f3a"
COMPLETION = "COMPLETION-CANARY-do-not-log-91bc"


@dataclass
class Site:
    url: str
    root: Path
    audit_dir: Path
    jwt_secret: str
    broker: Harness
    data_keys: dict[str, bytes]
    app: FastAPI
    stop: Any

    def token(self, role: str, tenant: str | None = None, subject: str | None = None) -> str:
        return issue_token(self.jwt_secret, subject or f"{role}@test", role, tenant)

    def broker_token(self, role: str, tenant: str | None = None) -> str | None:
        """The person's own key-broker token, which they give the console (it holds none): a tenant
        admin's tenant-admin token, the operator's admin token; the auditor has none."""
        if role == "tenant-admin" and tenant:
            return self.broker.tenant_token(tenant)
        return self.broker.admin_token if role == "operator" else None

    def secrets(self) -> list[str]:
        """Key material and content that must never be shown: data keys, tokens, secrets, canaries."""
        out = [PROMPT, COMPLETION, self.jwt_secret, self.broker.admin_token, "-----BEGIN",
               *(self.broker.tenant_token(t) for t in TENANTS)]
        for key in self.data_keys.values():
            out += [key.hex(), key.hex().upper()]
        return out


def _serve(app: FastAPI) -> tuple[str, Any]:
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    for _ in range(200):
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/healthz", timeout=1.0).status_code == 200:
                break
        time.sleep(0.05)

    def stop() -> None:
        server.should_exit = True
        thread.join(10)
    return url, stop


def _pem(key: Ed25519PrivateKey) -> bytes:
    return key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


def _component_log(audit_dir: Path, component: str) -> AuditLog:
    key = Ed25519PrivateKey.generate()
    (audit_dir / "keys").mkdir(parents=True, exist_ok=True)
    (audit_dir / "keys" / f"{component}.pem").write_bytes(_pem(key))
    return AuditLog(audit_dir / f"{component}.audit.jsonl", key, component, checkpoint_every=5)


def _heartbeat(url: str, register_token: str, tenant: str, attestation: dict[str, Any]) -> None:
    """A worker's signed heartbeat, as a worker sends it (identity key, id derived from it)."""
    key = Ed25519PrivateKey.generate()
    public = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    body: dict[str, Any] = {"worker_id": worker_id_for(public), "grpc_address": "127.0.0.1:1", "tenant": tenant,
                            "model": "chat", "version": "v1", "status": "ready", "tee": "sim", "insecure": True,
                            "usage_public_key": public.hex(), "pid": 1, "tls_cert": "", "stats": {},
                            "attestation": attestation, "seq": 1, "at": int(time.time())}
    body["signature"] = key.sign(heartbeat_signing_input(body)).hex()
    response = httpx.post(f"{url}/internal/workers/heartbeat", json=body, timeout=10.0,
                          headers={"Authorization": f"Bearer {register_token}"})
    assert response.status_code == 200, response.text


def build_site(root: Path) -> Site:
    broker = Harness(root, lambda: dt.datetime.now(dt.UTC))
    data_keys: dict[str, bytes] = {}
    releases = {}
    for tenant in TENANTS:
        data_keys[tenant] = broker.setup_tenant(tenant, model="chat", version="v1")
        releases[tenant] = broker.obtain(tenant, "chat", "v1")
    broker.obtain("acme", "chat", "v1")  # a second release for acme
    with contextlib.suppress(Exception):
        broker.obtain("globex", "chat", "v1", measurement=bytes(48))  # refused: wrong measurement
    broker.service.audit.checkpoint()
    broker_url, stop_broker = _serve(broker.app)

    audit_dir = root / "audit"
    gateway_log, worker_log = _component_log(audit_dir, "gateway"), _component_log(audit_dir, "worker")
    for tenant in TENANTS:
        for i in range(6):
            gateway_log.append(tenant=tenant, action="admit", decision="allow" if i % 3 else "deny",
                               reason="over the rate limit" if i % 3 == 0 else "admitted",
                               metadata={"rule": "admission.rate_limit" if i % 3 == 0 else "admission.allow",
                                         "model": "chat", "key_id": f"key_{tenant}"})
        worker_log.append(tenant=tenant, action="call_tool", decision="deny", reason="tool not on the allowlist",
                          metadata={"rule": f"agent.tools.{tenant}", "tool": "fetch"})
        worker_log.append(tenant=tenant, action="submit", decision="allow", reason="content passed",
                          metadata={"rule": "data.allow", "pii_redacted": 1})
    gateway_log.close()
    worker_log.close()

    policy_keys = root / "policy-keys"
    admin_keys = {}
    for tenant in TENANTS:
        admin_keys[tenant] = Ed25519PrivateKey.generate()
        (policy_keys / tenant).mkdir(parents=True, exist_ok=True)
        (policy_keys / tenant / f"{tenant}-admin.pub").write_bytes(_pem(admin_keys[tenant]))

    attestations = {t: {"tee": "sim", "insecure": True, "evidence": releases[t].bundle.to_json(),
                        "token": releases[t].token, "model_digest": "00" * 32} for t in TENANTS}

    jwt_secret, register_token = secrets.token_urlsafe(48), secrets.token_urlsafe(48)
    settings = GatewaySettings(
        data_dir=root / "gateway", dev=True, jwt_secret=jwt_secret, register_token=register_token,
        heartbeat_timeout_s=3600.0,
        console=ConsoleSettings(audit_dir=audit_dir, broker_url=broker_url,  # and no broker credential
                                policy_keys_dir=policy_keys,
                                # Reached over http://127.0.0.1, as under `sealed up`: httpx and the
                                # browser send no Secure cookie over plain HTTP.
                                unsafe_plain_http_loopback=True))
    (root / "gateway").mkdir(parents=True, exist_ok=True)
    service = build_gateway(settings)
    app = create_app(settings, service)
    store = service.store
    now = dt.datetime.now(dt.UTC)
    for n, tenant in enumerate(TENANTS):
        store.ensure_tenant(tenant, token_budget=5000 * (n + 1))
        _, key = store.create_key(tenant, f"{tenant}-app", token_budget=3000)
        store.upsert_version(ModelRef(tenant, "chat", "v1"))
        for i in range(30):
            store.record_usage(signed_row(store, request_id=f"r-{tenant}-{i}", tenant=tenant, key_id=key.key_id,
                                          model="chat", version="v1", worker_id=f"w-{tenant}", prompt_tokens=20 + i,
                                          completion_tokens=10 + n * 5, worker_seconds=0.25,
                                          created_at=now - dt.timedelta(minutes=40 * i)))
        policy = {"policy_id": f"{tenant}-policy", "version": 1, "tenant": tenant,
                  "data": {"retention_days": 30, "pii_input": {"US_SSN": "block"}}}
        store.put_policy(tenant, sign_policy_document(policy, admin_keys[tenant], f"{tenant}-admin"))
        policy2 = {**policy, "version": 2, "data": {"retention_days": 7, "pii_input": {"US_SSN": "block",
                                                                                     "CREDIT_CARD": "redact"}}}
        store.put_policy(tenant, sign_policy_document(policy2, admin_keys[tenant], f"{tenant}-admin"))
    url, stop_gateway = _serve(app)
    for tenant in TENANTS:
        _heartbeat(url, register_token, tenant, attestations[tenant])

    def stop() -> None:
        stop_gateway()
        stop_broker()
        broker.close()
    return Site(url, root, audit_dir, jwt_secret, broker, data_keys, app, stop)


@contextlib.contextmanager
def running_site(root: Path) -> Iterator[Site]:
    site = build_site(root)
    try:
        yield site
    finally:
        site.stop()


def login(client: httpx.Client, site: Site, role: str, tenant: str | None = None) -> httpx.Client:
    response = client.post(f"{site.url}/console/login", data={"token": site.token(role, tenant)})
    assert response.status_code == 303, response.text
    return client


def connect_broker(client: httpx.Client, site: Site, token: str) -> httpx.Response:
    """Give the console this person's own broker token (kept in the browser's cookie)."""
    page = client.get(f"{site.url}/console/keys").text
    csrf = re.search(r'name="csrf" value="([0-9a-f]+)"', page)
    assert csrf is not None, page[:500]
    return client.post(f"{site.url}/console/keys/broker", data={"token": token, "csrf": csrf.group(1)})


def dump(obj: Any) -> str:
    return json.dumps(obj, default=str)
