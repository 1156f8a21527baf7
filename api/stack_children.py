"""How `sealed up` starts and watches its children: on ports chosen at start (chosen again when
another process took one first), waiting until each answers, and the health check that restarts a
worker a fresh start may cure (api/stack.py uses these; api/supervisor.py runs the processes)."""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx

from api.errors import SealedApiError
from api.supervisor import Child, Supervisor, last_log_lines
from protocol.worker_status import restart_may_cure


def worker_health(worker_url: str) -> Callable[[Child], str | None]:
    """The supervisor's check of a `sealed up` worker: the reason it gives when it failed in a way a
    fresh start may cure (protocol/worker_status.py: the key broker was away, or its key's lease ran
    out and it wiped the model). These workers are outside the control loop, which replaces the
    failed workers it started itself. A worker that does not answer is not judged here: its process
    is the supervisor's to watch."""

    def check(_: Child) -> str | None:
        try:
            answer = httpx.get(f"{worker_url}/internal/status", timeout=1.0).json()
            status, reason = str(answer["status"]), str(answer.get("reason") or "")
        except (httpx.HTTPError, ValueError, KeyError, TypeError):
            return None
        return reason if restart_may_cure(status, reason) else None

    return check


PORT_TRIES = 3
_PORT_TAKEN = ("address already in use", "failed to bind")  # uvicorn's and gRPC's last words


class PortTaken(SealedApiError, RuntimeError):
    """A child exited because a port chosen for it was bound by another process first."""


def on_free_ports(supervisor: Supervisor, name: str, start: Callable[[], str]) -> str:
    """`start()` a child on ports it chooses and wait until it answers; choose again when a port was
    taken before the child bound it. free_port() only checks that a port is free now: a worker
    imports torch for seconds before it binds, and another process on the machine (a second stack, a
    test) may pick the same port meanwhile (seen: a worker's gRPC bind failing in a busy test run).
    Later restarts by the supervisor keep the ports the child bound."""
    for attempt in range(1, PORT_TRIES + 1):
        try:
            return start()
        except PortTaken as exc:
            supervisor.remove(name)
            if attempt == PORT_TRIES:
                raise RuntimeError(f"{name}: no free port after {PORT_TRIES} tries ({exc})") from exc
    raise AssertionError("unreachable")


def wait_http(url: str, child: Child, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        proc = child.proc
        if proc is not None and proc.poll() is not None:
            failed = child.failed()
            if failed is not None:
                raise failed  # one line that says why; restarting cannot help
            said = last_log_lines(child.log_path, 8).lower()
            if any(words in said for words in _PORT_TAKEN):
                raise PortTaken(f"{child.name} could not bind its port (log: {child.log_path})")
            raise RuntimeError(f"{child.name} exited with {proc.returncode} (log: {child.log_dir / child.name}.log)")
        try:
            if httpx.get(url, timeout=1.0).status_code < 500:
                return
        except httpx.HTTPError:
            time.sleep(0.1)
    raise TimeoutError(f"{url} did not come up")
