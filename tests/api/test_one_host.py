"""One host under `sealed up`'s supervisor: kill -9 of the broker or the gateway under load, a
second `sealed up` beside a running one, and the terminal closing (SIGHUP) on `make run`."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import pytest

from api.cli.audit import load_component_keys
from api.stack import DEMO_MODEL, free_port
from policy.audit import WitnessFile, verify_dir
from policy.errors import AuditIntegrityError
from tests.api.traffic import ChatTraffic, wait_ready

RESTART_BOUND_S = 15.0


@dataclass
class Host:
    url: str
    api_key: str
    home: Path
    proc: subprocess.Popen
    log: Path

    def pids(self) -> dict:
        return json.loads((self.home / "run" / "pids.json").read_text())


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Host]:
    root = tmp_path_factory.mktemp("onehost")
    home, port = root / "home", free_port()
    env = {**os.environ, "SEALED_HOME": str(home), "TMPDIR": str(root), "PYTHONUNBUFFERED": "1"}
    # As `make run` runs it from a terminal: a shell in its own process group (the terminal's job).
    proc = subprocess.Popen(["sh", "-c", f"{sys.executable} -m api.cli.main up --port {port}"], env=env,
                            stdout=open(root / "up.log", "wb"), stderr=subprocess.STDOUT,  # noqa: SIM115
                            start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(proc, url, root / "up.log")
    except TimeoutError:
        os.killpg(proc.pid, signal.SIGINT)
        raise
    running = Host(url, (home / "demo" / "api-key").read_text().strip(), home, proc, root / "up.log")
    yield running
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)


def _broker_admin(host: Host, method: str, path: str) -> httpx.Response:
    token = (host.home / "broker" / "admin-token").read_text().strip()
    return httpx.request(method, f"{host.pids()['broker_url']}/v1/admin{path}", timeout=30,
                         headers={"Authorization": f"Bearer {token}"})


def _wait_new_pid(host: Host, name: str, old: int) -> float:
    started = time.monotonic()
    while time.monotonic() - started < RESTART_BOUND_S * 2:
        pid = host.pids().get(name)
        if pid and pid != old and _alive(pid):
            return time.monotonic() - started
        time.sleep(0.1)
    raise AssertionError(f"{name} was not restarted")


def _printed_line(host: Host, command: str) -> str:
    """The line of `sealed up`'s banner that starts with `command` (the banner follows readiness)."""
    deadline = time.monotonic() + 120  # a hang guard for the banner, not a measured duration
    while True:
        found = [ln.strip() for ln in host.log.read_text().splitlines() if ln.strip().startswith(command)]
        if found:
            return found[0]
        assert time.monotonic() < deadline and host.proc.poll() is None, host.log.read_text()[-3000:]
        time.sleep(0.2)


def test_the_printed_sealed_verify_line_works_when_pasted(host: Host) -> None:
    """Exactly the printed arguments, through the CLI, in a shell that has no API key in its
    environment (it used to answer 401: the line lacked the key)."""
    line = _printed_line(host, "sealed verify ")
    argv = shlex.split(line)
    assert argv[:2] == ["sealed", "verify"]
    env = {k: v for k, v in os.environ.items() if k not in ("SEALED_API_KEY", "OPENAI_API_KEY")}
    out = subprocess.run([sys.executable, "-m", "api.cli.main", *argv[1:]], env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "worker " in out.stdout and "measurement" in out.stdout
    assert "token keys taken from its attestation" in out.stdout  # the broker's own, not a file of the operator's
    assert host.api_key not in out.stdout + out.stderr  # named by its file, never printed


def test_sealed_up_says_its_console_cookie_is_not_secure_on_plain_http_loopback(host: Host) -> None:
    assert "--unsafe-console-plain-http-loopback" in _printed_line(host, "Console: ")


def test_sealed_up_says_it_signs_in_in_the_local_development_mode(host: Host) -> None:
    line = _printed_line(host, "Sign-in: ")
    assert "local development mode" in line and "--oidc-config" in line


def test_a_second_sealed_up_beside_a_running_one_prints_one_line_and_fails(host: Host) -> None:
    env = {**os.environ, "SEALED_HOME": str(host.home)}
    out = subprocess.run([sys.executable, "-m", "api.cli.main", "up", "--port", str(free_port())], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode != 0
    lines = (out.stdout + out.stderr).strip().splitlines()
    assert len(lines) == 1, lines
    assert str(host.home / "run" / "sealed.pid") in lines[0]
    assert host.proc.poll() is None and httpx.get(f"{host.url}/healthz").status_code == 200


def test_kill_9_of_the_broker_under_load_loses_no_request(host: Host) -> None:
    before = host.pids()
    assert _broker_admin(host, "POST", "/tenants/before-broker-kill/key").status_code == 201
    with ChatTraffic(host.url, host.api_key, threads=3) as load:
        load.wait_for(3)
        os.kill(before["key-broker"], signal.SIGKILL)
        took = _wait_new_pid(host, "key-broker", before["key-broker"])
        deadline = time.monotonic() + RESTART_BOUND_S
        while not _ok(f"{before['broker_url']}/healthz"):
            assert time.monotonic() < deadline, "broker not back"
            time.sleep(0.2)
        load.wait_for(load.ok + 3)
    after = host.pids()
    assert took < RESTART_BOUND_S  # timed-assert-ok: the supervisor's restart bound (docs), ~10x a restart
    # The workers hold their key: serving never stopped, nothing failed.
    assert load.errors == []
    assert after["gateway"] == before["gateway"] and after["workers"] == before["workers"]
    # The audit log goes on from where it was: one chain, verified, with entries from both lives.
    assert _broker_admin(host, "POST", "/tenants/after-broker-kill/key").status_code == 201
    reports = verify_dir(host.home / "audit", load_component_keys(host.home / "audit" / "keys"))
    broker_log = (host.home / "audit" / "key-broker.audit.jsonl").read_text()
    assert any(r.component == "key-broker" for r in reports)
    assert "before-broker-kill" in broker_log and "after-broker-kill" in broker_log


def _usage_requests(host: Host) -> int:
    body = httpx.get(f"{host.url}/v1/usage", headers={"Authorization": f"Bearer {host.api_key}"}, timeout=10).json()
    return int(body["totals"]["requests"])


def test_kill_9_of_the_gateway_under_load_fails_only_in_flight_requests(host: Host) -> None:
    before = host.pids()
    used_before = _usage_requests(host)
    with ChatTraffic(host.url, host.api_key, threads=3) as load:
        load.wait_for(3)
        os.kill(before["gateway"], signal.SIGKILL)
        took = _wait_new_pid(host, "gateway", before["gateway"])
        deadline = time.monotonic() + RESTART_BOUND_S * 2
        while not _ready(host):
            assert time.monotonic() < deadline, "gateway did not find its worker again"
            time.sleep(0.2)
        load.wait_for(load.ok + 3)  # the restarted gateway serves again
    after = host.pids()
    assert took < RESTART_BOUND_S  # timed-assert-ok: the supervisor's restart bound (docs), ~10x a restart
    assert after["key-broker"] == before["key-broker"] and after["workers"] == before["workers"]
    # Only what was on the dead gateway failed (3 clients: at most 3 in flight), with a clear error,
    # and while it was down new connections were refused (never a hang).
    assert set(load.errors) <= {"APIConnectionError", "APITimeoutError", "InternalServerError",
                                "APIStatusError"}, load.errors
    assert not any(e == "APITimeoutError" for e in load.errors)
    # Usage continues: every answer a client received was metered, across both gateway lives; the
    # requests cut off on the dead gateway (at most one per client thread) are metered too, for the
    # tokens the worker ran: it settles them with the restarted gateway (its outbox, #35).
    metered = _usage_requests(host) - used_before
    assert load.ok <= metered <= load.ok + 3, (metered, load.ok)


def _ok(url: str) -> bool:
    try:
        return httpx.get(url, timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def _ready(host: Host) -> bool:
    return _ok(f"{host.url}/readyz")


def test_sigterm_of_a_worker_finishes_the_stream_in_flight(host: Host) -> None:
    """Scale-in and rollouts stop a worker with SIGTERM: it drains (takes no new request, finishes
    the streams it has) before its engine stops, so a client mid-answer gets the whole answer."""
    worker = host.pids()["workers"][0]
    client = openai.OpenAI(base_url=f"{host.url}/v1", api_key=host.api_key, max_retries=0, timeout=120)
    stream = client.chat.completions.create(
        model=DEMO_MODEL, messages=[{"role": "user", "content": "Write a long story about a dragon."}],
        max_tokens=8, temperature=0, stream=True)
    pieces, finish = [], None
    try:
        for i, chunk in enumerate(stream):
            if i == 2:
                os.kill(worker, signal.SIGTERM)
            if chunk.choices:
                pieces.append(chunk.choices[0].delta.content or "")
                finish = chunk.choices[0].finish_reason or finish
    except openai.APIError as exc:
        raise AssertionError(f"stream cut after {len(pieces)} chunks: {exc}") from exc
    assert finish in ("length", "stop"), finish
    assert len(pieces) > 3
    deadline = time.monotonic() + 60  # the supervisor starts it again; later tests need it ready
    while not (_alive(worker) is False and _ready(host)):
        assert time.monotonic() < deadline, "worker did not come back after draining"
        time.sleep(0.5)


def test_closing_the_terminal_sighup_leaves_no_process_behind(host: Host) -> None:
    pids = host.pids()
    everyone = [pids["supervisor"], pids["key-broker"], pids["gateway"], *pids["workers"]]
    assert all(_alive(p) for p in everyone)
    os.killpg(host.proc.pid, signal.SIGHUP)  # what the terminal does to its foreground job on hang-up
    host.proc.wait(60)
    deadline = time.monotonic() + 30
    while any(_alive(p) for p in everyone):
        assert time.monotonic() < deadline, [p for p in everyone if _alive(p)]
        time.sleep(0.2)
    assert not (host.home / "run" / "pids.json").exists()
    # Every component's log closed with a signed checkpoint, also kept in the witness outside the
    # audit directory, and the logs verify against it: losing a log with its .ckpt is detected.
    witness = WitnessFile(host.home / "witness" / "audit-checkpoints.jsonl")
    anchored = witness.read()
    written = {p.name for p in (host.home / "audit").glob("*.audit.jsonl") if p.stat().st_size}
    assert "key-broker.audit.jsonl" in written and {c.log for c in anchored} >= written, anchored
    keys = load_component_keys(host.home / "audit" / "keys")
    verify_dir(host.home / "audit", keys, anchored)
    (host.home / "audit" / "key-broker.audit.jsonl").unlink()
    (host.home / "audit" / "key-broker.audit.jsonl.ckpt").unlink()
    with pytest.raises(AuditIntegrityError):
        verify_dir(host.home / "audit", keys, anchored)
