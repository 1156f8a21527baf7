"""A warm worker's path from its assignment to its first token (issue #49): the assignment wakes the waiting
worker on its own event loop, the boot reuses the attester the worker made while it waited (on the simulated
TEE it hashes the worker's whole import closure: seconds that were spent again at every assignment and again
after "ready"), renewals reuse the boot's, and "announce" ends when a gateway has taken the ready beat."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from enclave_worker import freshness, standby
from enclave_worker.freshness import AttestationRenewal
from enclave_worker.heartbeat import heartbeats
from enclave_worker.settings import WorkerSettings
from enclave_worker.standby import Standby
from enclave_worker.state import LiveState, WorkerState

HANG_GUARD_S = 120.0  # only against a hang; nothing here is timed


def _state(tmp_path: Path) -> WorkerState:
    return WorkerState(WorkerSettings(broker_url="http://127.0.0.1:9", package_dir=tmp_path, tenant="acme",
                                      model="m", version="v1", unsafe_no_tenant_policy=True))


def test_the_assignment_wakes_the_wait_and_the_boot_gets_the_standby_attester(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    made = object()  # the attester made while waiting (a stand-in: nothing here attests)
    monkeypatch.setattr(standby, "attest_without_key", lambda *_: made)
    state, gate = _state(tmp_path), Standby()
    booted_with: list[object] = []

    async def boot(st: WorkerState, attester: object) -> None:
        booted_with.append(attester)

    async def run() -> list[int]:
        waiting = asyncio.create_task(gate.run(state, boot, lambda *_: pytest.fail("standby failed")))
        transport = httpx.ASGITransport(app=_app(state, gate))
        async with httpx.AsyncClient(transport=transport, base_url="http://worker") as client:
            while state.live.status != "standby":
                await asyncio.sleep(0.01)
            codes = [(await client.post("/internal/assign")).status_code]
            await asyncio.wait_for(waiting, HANG_GUARD_S)
            codes.append((await client.post("/internal/assign")).status_code)  # a second assignment
        return codes

    assert asyncio.run(run()) == [202, 409]
    assert booted_with == [made]  # the same attester, not a second measurement
    assert state.live.status == "starting" and state.cold_start.assigned_at is not None


def test_a_worker_that_is_not_standby_refuses_an_assignment_and_records_none(tmp_path: Path) -> None:
    state, gate = _state(tmp_path), Standby()  # still "starting": it has not attested yet

    async def run() -> int:
        transport = httpx.ASGITransport(app=_app(state, gate))
        async with httpx.AsyncClient(transport=transport, base_url="http://worker") as client:
            return (await client.post("/internal/assign")).status_code

    assert asyncio.run(run()) == 409
    assert not gate.assigned.is_set() and state.cold_start.assigned_at is None


def _app(state: WorkerState, gate: Standby) -> Any:
    from enclave_worker.server import create_app

    return create_app(state, gate)


class _Booted(SimpleNamespace):
    def wipe(self) -> None:
        pass


def _renewals(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, attester: object | None) -> tuple[list[Any], int]:
    """Run the renewal loop for one renewal; returns the bundle makers it used and how often it made one."""
    state = _state(tmp_path)
    state.live.ready(_Booted(attester=attester, released=SimpleNamespace(token="")))  # type: ignore[arg-type]
    made: list[int] = []
    used: list[Any] = []

    def bundle_maker(*_: object) -> Any:
        made.append(1)
        return "made-again"

    def renew_once(self: AttestationRenewal, make_bundle: Any) -> None:
        used.append(make_bundle)
        self.state.live.fail("stop")  # ends the loop at its next turn

    monkeypatch.setattr(freshness, "bundle_maker", bundle_maker)
    monkeypatch.setattr(freshness, "renew_in", lambda *_: 0.0)
    monkeypatch.setattr(AttestationRenewal, "renew_once", renew_once)
    asyncio.run(asyncio.wait_for(AttestationRenewal(state).run(), HANG_GUARD_S))
    return used, len(made)


def test_renewals_make_their_evidence_with_the_boots_attester(tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    attester = SimpleNamespace(bundle=lambda runtime: runtime)
    used, made = _renewals(tmp_path, monkeypatch, attester)
    assert used == [attester.bundle] and made == 0


def test_without_the_boots_attester_renewals_make_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    used, made = _renewals(tmp_path, monkeypatch, None)
    assert used == ["made-again"] and made == 1


@pytest.fixture
def gateway() -> Iterator[tuple[str, list[int], list[dict[str, Any]]]]:
    """A real HTTP listener that answers heartbeats with the status code at the head of ``codes``."""
    codes: list[int] = [200]
    beats: list[dict[str, Any]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            beats.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            reply = b'{"ok": true}'
            self.send_response(codes[0])
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", codes, beats
    finally:
        server.shutdown()
        server.server_close()


class _Ready:
    """The booted model as the heartbeat reads it (its content is not what this test is about)."""

    released = SimpleNamespace(bundle=SimpleNamespace(to_json=lambda: {}), token="")
    model_digest = ""
    gpu_cc_off = False
    load_s = 1.0
    engine = SimpleNamespace(stats=dict, tokenizer=None)

    def wipe(self) -> None:
        pass


@pytest.mark.parametrize(("code", "announced"), [(200, True), (401, False), (503, False)])
def test_announce_ends_when_a_gateway_has_taken_the_ready_beat(
        tmp_path: Path, gateway: tuple[str, list[int], list[dict[str, Any]]], code: int, announced: bool) -> None:
    url, codes, beats = gateway
    codes[0] = code
    state = WorkerState(WorkerSettings(broker_url="", package_dir=tmp_path, tenant="acme", model="m", version="v1"),
                        live=LiveState())
    state.cold_start.mark("boot", 0.0)
    state.cold_start.mark("load", state.cold_start.last_end())

    async def run() -> None:
        beat = asyncio.create_task(heartbeats(state, [url], "t" * 40, "127.0.0.1:7001", interval=3600.0))
        try:
            while not beats:  # "starting": never an announcement, whatever the answer
                await asyncio.sleep(0.01)
            assert "announce" not in state.cold_start.spans
            assert state.live.ready(_Ready())  # type: ignore[arg-type]
            while len(beats) < 2:
                await asyncio.sleep(0.01)
            # The beats go one after another: once the next one (draining) arrives, the reply to the
            # ready beat has been read and acted on.
            assert state.live.drain()
            while len(beats) < 3:
                await asyncio.sleep(0.01)
        finally:
            beat.cancel()

    asyncio.run(asyncio.wait_for(run(), HANG_GUARD_S))
    assert [b["status"] for b in beats] == ["starting", "ready", "draining"]
    assert ("announce" in state.cold_start.spans) is announced
