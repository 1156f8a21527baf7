"""Two gateway processes sharing PostgreSQL and Redis: a tenant's rate limit holds across both."""

from __future__ import annotations

import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from api.stack import free_port
from api.store.db import make_engine, session_factory, upgrade
from api.store.repo import Store
from protocol.model_ref import ModelRef
from tests.api.fleet import REDIS_URL, postgres_database, redis_client


@pytest.fixture()
def pg_url() -> Iterator[str]:
    yield from postgres_database()


def _start_gateway(tmp: Path, name: str, db_url: str, redis_url: str) -> tuple[subprocess.Popen, str]:
    data = tmp / name
    data.mkdir()
    for secret in ("register-token", "jwt-secret"):
        (data / secret).write_text(secrets.token_urlsafe(48))
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "api.gateway", "--data-dir", str(data), "--port", str(port),
                             "--database-url", db_url, "--redis-url", redis_url,
                             "--register-token-file", str(data / "register-token"),
                             "--jwt-secret-file", str(data / "jwt-secret")],
                            stdout=open(tmp / f"{name}.log", "wb"), stderr=subprocess.STDOUT)  # noqa: SIM115
    return proc, f"http://127.0.0.1:{port}"


def _wait(url: str, proc: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"gateway exited:\n{log.read_text(errors='replace')[-4000:]}"
        try:
            httpx.get(f"{url}/healthz", timeout=1)
            return
        except httpx.HTTPError:
            time.sleep(0.2)
    raise TimeoutError(url)


def test_tenant_rpm_holds_across_two_gateway_processes(tmp_path: Path, pg_url: str) -> None:
    client = redis_client()
    db = f"{REDIS_URL.rsplit('/', 1)[0]}/14"
    engine = make_engine(pg_url)
    upgrade(engine)
    store = Store(session_factory(engine))
    tenant = f"t{secrets.token_hex(4)}"
    store.ensure_tenant(tenant, rpm=5)
    store.upsert_version(ModelRef(tenant, "m", "v1"))
    secret, _ = store.create_key(tenant, "k")
    engine.dispose()
    gateways = [_start_gateway(tmp_path, f"gw{i}", pg_url, db) for i in range(2)]
    try:
        for i, (proc, url) in enumerate(gateways):
            _wait(url, proc, tmp_path / f"gw{i}.log")
        statuses = []
        for i in range(12):
            url = gateways[i % 2][1]
            r = httpx.post(f"{url}/v1/chat/completions", headers={"Authorization": f"Bearer {secret}"},
                           json={"model": "m", "messages": [{"role": "user", "content": "hi"}]}, timeout=10)
            statuses.append(r.status_code)
        # Admitted requests find no worker (503); the rest are over the shared limit (429). Each process
        # alone would have admitted 5 of its own 6.
        assert statuses.count(429) == 7 and statuses.count(503) == 5, statuses
        r429 = httpx.post(f"{gateways[0][1]}/v1/chat/completions", headers={"Authorization": f"Bearer {secret}"},
                          json={"model": "m", "messages": [{"role": "user", "content": "hi"}]}, timeout=10)
        assert r429.json()["error"]["code"] == "rate_limit_exceeded" and "retry-after" in r429.headers
    finally:
        for proc, _ in gateways:
            proc.terminate()
            proc.wait(10)
        client.connection_pool.disconnect()
