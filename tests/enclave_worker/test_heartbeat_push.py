"""Readiness is pushed: a change of the worker's status sends a heartbeat at once, not at the next tick
(issue #49: a warm worker's first token after assignment). The beats go to a real HTTP listener; the
interval is an hour, so a second beat within the test can only be the pushed one."""

from __future__ import annotations

import asyncio
import json
import queue
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from enclave_worker.heartbeat import heartbeats
from enclave_worker.settings import WorkerSettings
from enclave_worker.state import LiveState, WorkerState
from protocol.heartbeat import verify_heartbeat_signature

TOKEN = "t" * 40
HANG_GUARD_S = 120.0  # only against a hang: without the push the next beat is an hour away


@pytest.fixture
def listener() -> Iterator[tuple[str, queue.Queue[dict[str, Any]]]]:
    """A real HTTP server that takes heartbeats as a gateway does (status 200) and keeps their bodies."""
    beats: queue.Queue[dict[str, Any]] = queue.Queue()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            if self.path == "/internal/workers/heartbeat" and self.headers["Authorization"] == f"Bearer {TOKEN}":
                beats.put(json.loads(body))
            reply = b'{"ok": true}'
            self.send_response(200)
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", beats
    finally:
        server.shutdown()
        server.server_close()


class FakeBooted:
    """The booted model's seam as the heartbeat reads it (no attestation: this test is about timing of
    the beats, not their content; the gateway's checks of a beat are tested in tests/security)."""

    released = SimpleNamespace(bundle=SimpleNamespace(to_json=lambda: {}), token="")
    model_digest = ""
    gpu_cc_off = False
    load_s = 1.0
    engine = SimpleNamespace(stats=dict, tokenizer=None)

    def wipe(self) -> None:
        pass


def _state(tmp_path: Path) -> WorkerState:
    return WorkerState(WorkerSettings(broker_url="", package_dir=tmp_path, tenant="acme", model="m", version="v1"))


async def _next_beat(beats: queue.Queue[dict[str, Any]]) -> dict[str, Any]:
    return await asyncio.to_thread(beats.get, True, HANG_GUARD_S)


# Each status change, from the state it starts in: the beat that follows says the new status at once.
CHANGES: list[tuple[str, Callable[[LiveState], object], str]] = [
    ("standby", lambda live: live.standby(), "standby"),
    ("ready", lambda live: live.ready(FakeBooted()), "ready"),  # type: ignore[arg-type]
    ("failed", lambda live: live.fail("why"), "failed"),
]


@pytest.mark.parametrize(("name", "change", "said"), CHANGES, ids=[c[0] for c in CHANGES])
def test_a_status_change_is_heard_at_once(tmp_path: Path, listener: tuple[str, queue.Queue[dict[str, Any]]],
                                          name: str, change: Callable[[LiveState], object], said: str) -> None:
    url, beats = listener
    state = _state(tmp_path)

    async def run() -> list[dict[str, Any]]:
        beat = asyncio.create_task(heartbeats(state, [url], TOKEN, "127.0.0.1:7001", interval=3600.0))
        try:
            first = await _next_beat(beats)
            change(state.live)
            second = await _next_beat(beats)
        finally:
            beat.cancel()
        return [first, second]

    first, second = asyncio.run(run())
    assert (first["status"], second["status"]) == ("starting", said)
    assert second["seq"] == first["seq"] + 1  # in order: the gateway refuses a stale sequence number
    for body in (first, second):
        verify_heartbeat_signature(body)  # signed as every beat is: the push weakens no check


def test_the_whole_warm_start_is_pushed(tmp_path: Path, listener: tuple[str, queue.Queue[dict[str, Any]]]) -> None:
    """starting -> standby -> (assigned) starting -> ready -> draining: one beat for each, in order."""
    url, beats = listener
    state = _state(tmp_path)

    async def run() -> list[str]:
        beat = asyncio.create_task(heartbeats(state, [url], TOKEN, "127.0.0.1:7001", interval=3600.0))
        said = [(await _next_beat(beats))["status"]]
        try:
            for step in (state.live.standby, state.live.assign, lambda: state.live.ready(FakeBooted()),  # type: ignore[arg-type]
                         state.live.drain):
                assert step()
                said.append((await _next_beat(beats))["status"])
        finally:
            beat.cancel()
        return said

    assert asyncio.run(run()) == ["starting", "standby", "starting", "ready", "draining"]


# A transition refused (from the wrong state) changes nothing, so it pushes nothing.
REFUSED: list[tuple[str, str, Callable[[LiveState], bool]]] = [
    ("ready twice", "ready", lambda live: live.ready(FakeBooted())),  # type: ignore[arg-type]
    ("standby while ready", "ready", LiveState.standby),
    ("assign while starting", "starting", LiveState.assign),
    ("drain while starting", "starting", LiveState.drain),
    ("standby after failing", "failed", LiveState.standby),
]


@pytest.mark.parametrize(("name", "status", "transition"), REFUSED, ids=[r[0] for r in REFUSED])
def test_a_refused_transition_pushes_nothing(name: str, status: str, transition: Callable[[LiveState], bool]) -> None:
    live = LiveState(status=status)  # type: ignore[arg-type]
    assert not transition(live)
    assert live.status == status and not live.changed.is_set()


def test_a_renewal_waits_for_the_next_beat() -> None:
    """A renewal runs on a thread: it never touches the loop's event (the next beat carries the new evidence)."""
    old, new = FakeBooted(), FakeBooted()
    live = LiveState(status="ready", booted=old)  # type: ignore[arg-type]
    live.renewed(old, new)  # type: ignore[arg-type]
    assert live.booted is new and not live.changed.is_set()
