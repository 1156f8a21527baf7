"""Pieces of the audit-forwarding kill -9 test: restartable processes, a seeded plan of kills and
restarts keyed to request counts (not to time, so a loaded machine changes only how long it takes),
and a request driver whose progress the plan waits on."""

from __future__ import annotations

import random
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

HANG_GUARD_S = 300.0  # a wait that never ends fails the test instead of hanging CI; no timing is asserted


def wait_until(ready: Callable[[], bool], what: str, alive: Callable[[], bool] = lambda: True) -> None:
    deadline = time.monotonic() + HANG_GUARD_S
    while not ready():
        assert alive(), f"{what}: the process exited"
        assert time.monotonic() < deadline, f"{what}: not ready"
        threading.Event().wait(0.05)


def listening(port: int) -> Callable[[], bool]:
    def probe() -> bool:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return True
        except OSError:
            return False
    return probe


@dataclass
class Proc:
    """A process the test starts, kills with SIGKILL and starts again with the same arguments."""

    name: str
    argv: list[str]
    env: dict[str, str]
    log: Path
    ready: Callable[[], bool] = lambda: True
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(self.argv, env=self.env, stdout=out, stderr=subprocess.STDOUT)
        proc = self.proc
        wait_until(self.ready, self.name, lambda: proc.poll() is None)

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()
        self.proc = None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None


@dataclass(frozen=True)
class Step:
    at: int  # after this many acknowledged requests
    action: str  # "kill" or "start"
    target: str


def make_plan(seed: int, requests: int, kills: dict[str, int], max_down: int) -> list[Step]:
    """For each target, `kills[target]` kill -9s at random request counts, each followed by a start
    after 0..max_down more requests (the gateway at once: requests cannot go on without it). A
    target's windows never overlap, so each kill finds it running."""
    rng = random.Random(seed)
    plan: list[Step] = []
    for target, count in sorted(kills.items()):
        points = sorted(rng.sample(range(10, requests - 10), count))
        for i, at in enumerate(points):
            limit = points[i + 1] if i + 1 < len(points) else requests
            down = 0 if target == "gateway" else rng.randrange(0, max_down + 1)
            plan += [Step(at, "kill", target), Step(min(at + down, limit), "start", target)]
    return sorted(plan, key=lambda s: s.at)  # stable: a target's own kill stays before its start


@dataclass
class Driver:
    """Sends `requests` audited management calls one after another; a call that fails because the
    gateway is down is sent again once it is back (so one may be audited twice, never zero times
    once acknowledged). `acked` names each call the gateway answered."""

    url: str
    token: str
    requests: int
    gateway_up: threading.Event = field(default_factory=threading.Event)
    acked: list[str] = field(default_factory=list)
    retries: int = 0
    error: BaseException | None = None
    _progress: threading.Condition = field(default_factory=threading.Condition)

    def run(self) -> None:
        try:
            with httpx.Client(timeout=60, headers={"Authorization": f"Bearer {self.token}"}) as client:
                for i in range(self.requests):
                    self._one(client, f"t{i:04d}")
        except BaseException as exc:  # handed to the test's thread
            self.error = exc
        with self._progress:
            self._progress.notify_all()

    def _one(self, client: httpx.Client, name: str) -> None:
        while True:
            self.gateway_up.wait()
            try:
                reply = client.post(f"{self.url}/admin/v1/tenants", json={"name": name})
            except httpx.TransportError:
                self.retries += 1
                continue
            assert reply.status_code == 201, reply.text
            with self._progress:
                self.acked.append(name)
                self._progress.notify_all()
            return

    def wait_for(self, count: int) -> None:
        deadline = time.monotonic() + HANG_GUARD_S
        with self._progress:
            while len(self.acked) < count and self.error is None:
                assert time.monotonic() < deadline, f"requests stalled at {len(self.acked)}"
                self._progress.wait(1.0)
        if self.error is not None:
            raise self.error
