"""Routing and lifecycle with several worker processes on localhost (stand-in workers speaking the
real gRPC protocol): versions, gradual rollout, rollback, worker death, the management API's roles,
signed usage, and 500 concurrent streams with none lost."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from api.management.auth import issue_token
from api.stack import free_port


@dataclass
class Fleet:
    url: str
    jwt_secret: str
    api_key: str = ""
    workers: dict[str, tuple[str, subprocess.Popen]] = field(default_factory=dict)  # name -> (version, proc)

    def admin(self, role: str = "operator", tenant: str | None = None) -> dict[str, str]:
        return {"Authorization": f"Bearer {issue_token(self.jwt_secret, 'test', role, tenant)}"}


def _worker(tmp: Path, url: str, name: str, version: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "tests.api.fake_worker", "--gateway", url, "--token-file",
                             str(tmp / "gw" / "register-token"), "--version", version, "--grpc-port",
                             str(free_port()), "--http-port", str(free_port())],
                            stdout=open(tmp / f"{name}.log", "wb"), stderr=subprocess.STDOUT,
                            env={**os.environ, "PYTHONPATH": os.getcwd()})


def _ready_workers(fleet: Fleet) -> list[dict]:
    return [w for w in httpx.get(f"{fleet.url}/admin/v1/workers", headers=fleet.admin()).json()["data"]
            if w["status"] == "ready"]


def _wait_workers(fleet: Fleet, n: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while len(_ready_workers(fleet)) < n:
        assert time.monotonic() < deadline, "workers did not register"
        time.sleep(0.2)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    tmp = tmp_path_factory.mktemp("fleet")
    (tmp / "gw").mkdir()
    for name in ("register-token", "jwt-secret"):
        (tmp / "gw" / name).write_text(os.urandom(32).hex())
    port = free_port()
    gateway = subprocess.Popen([sys.executable, "-m", "api.gateway", "--data-dir", str(tmp / "gw"), "--port",
                                str(port), "--register-token-file", str(tmp / "gw" / "register-token"),
                                "--jwt-secret-file", str(tmp / "gw" / "jwt-secret")],
                               stdout=open(tmp / "gateway.log", "wb"), stderr=subprocess.STDOUT)  # noqa: SIM115
    fleet = Fleet(f"http://127.0.0.1:{port}", (tmp / "gw" / "jwt-secret").read_text())
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                httpx.get(f"{fleet.url}/healthz", timeout=1)
                break
            except httpx.HTTPError:
                assert time.monotonic() < deadline and gateway.poll() is None
                time.sleep(0.2)
        h = fleet.admin()
        assert httpx.post(f"{fleet.url}/admin/v1/tenants", headers=h, json={"name": "acme"}).status_code == 201
        for version in ("v1", "v2"):
            httpx.post(f"{fleet.url}/admin/v1/tenants/acme/models", headers=h,
                       json={"model": "m", "version": version}).raise_for_status()
        r = httpx.post(f"{fleet.url}/admin/v1/tenants/acme/keys", headers=fleet.admin("tenant-admin", "acme"),
                       json={"name": "app", "models": ["m"]})
        fleet.api_key = r.json()["secret"]
        for name, version in (("a", "v1"), ("b", "v1"), ("c", "v2")):
            fleet.workers[name] = (version, _worker(tmp, fleet.url, name, version))
        _wait_workers(fleet, 3)
        yield fleet
    finally:
        for _, proc in fleet.workers.values():
            proc.terminate()
        gateway.terminate()
        for proc in [gateway, *(p for _, p in fleet.workers.values())]:
            proc.wait(10)


def _versions(fleet: Fleet, n: int) -> Counter[str]:
    async def one(client: httpx.AsyncClient) -> str:
        r = await client.post("/v1/completions", json={"model": "m", "prompt": "x", "max_tokens": 1})
        r.raise_for_status()
        return r.json()["choices"][0]["text"].strip()

    async def run() -> list[str]:
        async with httpx.AsyncClient(base_url=fleet.url, timeout=30,
                                     headers={"Authorization": f"Bearer {fleet.api_key}"}) as client:
            return await asyncio.gather(*(one(client) for _ in range(n)))

    return Counter(asyncio.run(run()))


def _rollout(fleet: Fleet, action: str, body: dict | None = None) -> None:
    httpx.post(f"{fleet.url}/admin/v1/tenants/acme/models/m/{action}", headers=fleet.admin("tenant-admin", "acme"),
               json=body).raise_for_status()


def test_versions_rollout_by_percent_and_one_call_rollback(fleet: Fleet) -> None:
    assert set(_versions(fleet, 20)) == {"v1"}  # the first version holds all traffic
    _rollout(fleet, "rollout", {"version": "v2", "percent": 50})
    split = _versions(fleet, 60)
    assert split["v1"] > 10 and split["v2"] > 10, split
    _rollout(fleet, "rollout", {"version": "v2", "percent": 100})
    assert set(_versions(fleet, 20)) == {"v2"}
    _rollout(fleet, "rollback")
    back = _versions(fleet, 40)
    assert back["v1"] > 5 and back["v2"] > 5, back
    _rollout(fleet, "rollout", {"version": "v1", "percent": 100})


def test_management_roles(fleet: Fleet) -> None:
    url = fleet.url
    _versions(fleet, 2)  # some signed usage to read back
    assert httpx.get(f"{url}/admin/v1/tenants", headers=fleet.admin("tenant-admin", "acme")).status_code == 403
    assert httpx.get(f"{url}/admin/v1/tenants/acme/keys", headers=fleet.admin("tenant-admin", "other")
                     ).status_code == 404
    assert httpx.post(f"{url}/admin/v1/tenants/acme/keys", headers=fleet.admin("tenant-user", "acme"),
                      json={"name": "x"}).status_code == 403
    assert httpx.get(f"{url}/admin/v1/tenants", headers={"Authorization": "Bearer nope"}).status_code == 401
    # Package uploads (the package helper's routes) are for tenant admins.
    assert httpx.post(f"{url}/v1/packages/uploads", headers=fleet.admin("tenant-user", "acme"),
                      json={"files": {}}).status_code == 403
    assert httpx.post(f"{url}/v1/packages/uploads", headers=fleet.admin("tenant-admin", "acme"),
                      json={"files": {}}).status_code in (400, 422)
    keys = httpx.get(f"{url}/admin/v1/tenants/acme/keys", headers=fleet.admin("auditor")).json()["data"]
    assert keys and all("secret" not in k and "key_hash" not in k for k in keys)
    usage = httpx.get(f"{url}/admin/v1/usage", headers=fleet.admin("tenant-user", "acme")).json()["data"]
    assert usage and usage[0]["tenant"] == "acme" and usage[0]["completion_tokens"] > 0


def test_agent_kill_switch_reaches_the_worker_on_the_next_request(fleet: Fleet) -> None:
    url, admin = fleet.url, fleet.admin("tenant-admin", "acme")
    key = httpx.post(f"{url}/admin/v1/tenants/acme/keys", headers=admin, json={"name": "agent", "models": ["m"]}
                     ).json()
    agent = {"Authorization": f"Bearer {key['secret']}"}
    switch = f"{url}/admin/v1/tenants/acme/keys/{key['key_id']}/kill-switch"

    def answer() -> str:
        r = httpx.post(f"{url}/v1/chat/completions", headers=agent, timeout=30,
                       json={"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 1})
        r.raise_for_status()
        return r.json()["choices"][0]["message"]["content"]

    assert "-killed" not in answer()
    # Only the tenant's own admins (or the operator) may flip it; a tenant user or another tenant cannot.
    assert httpx.put(switch, headers=fleet.admin("tenant-user", "acme"), json={"killed": True}).status_code == 403
    assert httpx.put(switch, headers=fleet.admin("tenant-admin", "other"), json={"killed": True}).status_code == 404
    assert httpx.put(switch, headers=admin, json={"killed": "yes"}).status_code == 400  # typed: no coercion
    assert httpx.put(f"{url}/admin/v1/tenants/acme/keys/key_nope/kill-switch", headers=admin,
                     json={"killed": True}).status_code == 404
    assert "-killed" not in answer()  # none of the refused calls changed anything
    assert httpx.put(switch, headers=admin, json={"killed": True}).json() == {"key_id": key["key_id"],
                                                                             "tools_killed": True}
    assert "-killed" in answer()  # the very next request carries it
    httpx.put(switch, headers=admin, json={"killed": False}).raise_for_status()
    assert "-killed" not in answer()


def test_worker_death_ends_streams_clearly_and_new_requests_go_elsewhere(fleet: Fleet) -> None:
    headers = {"Authorization": f"Bearer {fleet.api_key}"}
    events: list[str] = []
    with httpx.stream("POST", f"{fleet.url}/v1/completions", headers=headers, timeout=30,
                      json={"model": "m", "prompt": "x", "max_tokens": 400, "stream": True}) as r:
        lines = r.iter_lines()
        while len(events) < 3:
            line = next(lines)
            if line.startswith("data: "):
                events.append(line)
        busy = [w for w in _ready_workers(fleet) if w["inflight"] > 0]
        assert len(busy) == 1
        (victim,) = [proc for _, proc in fleet.workers.values() if proc.pid == busy[0]["pid"]]
        victim.send_signal(signal.SIGKILL)
        events += [line for line in lines if line.startswith("data: ")]
    last = json.loads(events[-1][6:])
    assert last["error"]["code"] == "worker_lost", events[-2:]
    assert set(_versions(fleet, 10)) == {"v1"}  # the other v1 worker serves, without waiting for a timeout


def test_500_concurrent_streams_none_lost(fleet: Fleet) -> None:
    async def one(client: httpx.AsyncClient) -> tuple[int, bool]:
        tokens, done = 0, False
        async with client.stream("POST", "/v1/completions", json={"model": "m", "prompt": "x", "max_tokens": 8,
                                                                   "stream": True}) as r:
            assert r.status_code == 200
            async for line in r.aiter_lines():
                if line == "data: [DONE]":
                    done = True
                elif line.startswith("data: "):
                    tokens += 1
        return tokens, done

    async def run() -> list[tuple[int, bool]]:
        limits = httpx.Limits(max_connections=600, max_keepalive_connections=600)
        async with httpx.AsyncClient(base_url=fleet.url, timeout=120, limits=limits,
                                     headers={"Authorization": f"Bearer {fleet.api_key}"}) as client:
            return await asyncio.gather(*(one(client) for _ in range(500)))

    results = asyncio.run(run())
    assert len(results) == 500 and all(done and tokens == 8 for tokens, done in results)
