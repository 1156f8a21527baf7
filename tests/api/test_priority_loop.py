"""The gateway's event loop runs a light tenant's callbacks first (api/gateway/priority_loop.py), and
the gateway marks which requests are light: a tenant with little in flight, as the reserve counts it."""

from __future__ import annotations

import asyncio
import collections
import contextvars
import inspect
import re
import threading
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from api.gateway.admission_gate import AdmissionGate
from api.gateway.lifecycle import RequestLifecycle
from api.gateway.priority_loop import URGENT, PriorityEventLoop, TwoLevelReadyQueue, mark_urgent
from tests.api.fake_worker import FakeServicer
from tests.security.harness import gateway


def _run(main: Any) -> Any:
    with asyncio.Runner(loop_factory=PriorityEventLoop) as runner:
        return runner.run(main)


def _step_order(loop_factory: Callable[[], asyncio.AbstractEventLoop], tasks: dict[str, bool], steps: int
                ) -> list[str]:
    """The order in which tasks (name: urgent), started in that order, finish each of their steps."""
    order: list[str] = []

    async def task(name: str, urgent: bool) -> None:
        mark_urgent(urgent)
        for _ in range(steps):
            await asyncio.sleep(0)
            order.append(name)

    async def main() -> None:
        await asyncio.gather(*(task(name, urgent) for name, urgent in tasks.items()))

    with asyncio.Runner(loop_factory=loop_factory) as runner:
        runner.run(main())
    return order


def test_an_urgent_tasks_steps_run_before_normal_ones_that_were_ready_first() -> None:
    order = _step_order(PriorityEventLoop, {"n0": False, "n1": False, "n2": False, "U": True}, 3)
    assert order == ["U"] * 3 + ["n0", "n1", "n2"] * 3  # normal tasks keep their round-robin order


def test_on_asyncios_own_loop_the_same_tasks_run_in_fifo_order() -> None:
    """The control: what the priority loop changes (and that the test above can fail)."""
    assert _step_order(asyncio.SelectorEventLoop, {"n0": False, "U": True}, 2) == ["n0", "U", "n0", "U"]


def test_children_inherit_urgency_and_a_task_can_give_it_up() -> None:
    order: list[str] = []

    async def child(name: str) -> None:
        await asyncio.sleep(0)
        order.append(name)

    async def urgent_parent() -> None:
        mark_urgent(True)
        await asyncio.gather(child("u-child"), child("u-child"))  # tasks copy the context: urgent
        mark_urgent(False)
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        order.append("demoted")

    async def normal() -> None:
        await asyncio.sleep(0)
        order.append("normal")
        await asyncio.sleep(0)
        order.append("normal")

    async def main() -> None:
        await asyncio.gather(normal(), urgent_parent())

    _run(main())
    assert order[:2] == ["u-child", "u-child"]
    assert order.index("demoted") > order.index("normal")  # once demoted it waits its FIFO turn


def test_callbacks_scheduled_here_and_from_other_threads_take_their_contexts_urgency() -> None:
    order: list[str] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        done = asyncio.Event()
        loop.call_soon(order.append, "normal")
        mark_urgent(True)
        urgent_context = contextvars.copy_context()
        mark_urgent(False)
        thread = threading.Thread(target=lambda: loop.call_soon_threadsafe(order.append, "threadsafe",
                                                                           context=urgent_context))
        thread.start()
        thread.join()
        loop.call_soon(done.set)
        await done.wait()

    _run(main())
    assert order == ["threadsafe", "normal"]


def test_the_ready_queue_is_two_fifos_and_counts_both() -> None:
    queue = TwoLevelReadyQueue()
    assert not queue and len(queue) == 0
    loop = asyncio.new_event_loop()
    try:
        normal = [asyncio.Handle(print, (i,), loop, contextvars.Context()) for i in range(2)]
        ctx = contextvars.Context()
        ctx.run(URGENT.set, True)
        urgent = asyncio.Handle(print, ("u",), loop, ctx)
        queue.append(normal[0])
        queue.append(urgent)
        queue.append(normal[1])
        assert len(queue) == 3 and queue
        assert [queue.popleft(), queue.popleft(), queue.popleft()] == [urgent, *normal]
        queue.append(urgent)
        queue.clear()
        assert not queue
    finally:
        loop.close()


def test_this_python_gets_the_priorities() -> None:
    loop = PriorityEventLoop()
    try:
        assert loop.prioritised and isinstance(loop._ready, TwoLevelReadyQueue)  # type: ignore[attr-defined]
    finally:
        loop.close()


def test_a_python_without_the_ready_deque_falls_back_to_fifo_and_still_serves(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """A changed CPython (its ready queue not an empty deque) must not stop the gateway from starting:
    the loop keeps asyncio's own queue and order, and says so."""
    real_init = asyncio.SelectorEventLoop.__init__

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        real_init(self, *args, **kwargs)
        self._ready = collections.deque([None])  # not empty: not the queue this module knows

    monkeypatch.setattr(asyncio.SelectorEventLoop, "__init__", init)
    loop = PriorityEventLoop()
    try:
        assert not loop.prioritised and not isinstance(loop._ready, TwoLevelReadyQueue)  # type: ignore[attr-defined]
        assert "no `_ready` deque to replace" in caplog.text
    finally:
        loop._ready.clear()  # type: ignore[attr-defined]
        loop.close()
    monkeypatch.undo()
    assert _step_order(_fifo_fallback_loop, {"n0": False, "U": True}, 2) == ["n0", "U", "n0", "U"]


def test_this_pythons_loop_uses_only_what_the_two_level_queue_has() -> None:
    """The canary for a new Python (run the suite on each one the project supports): the base loop
    may use its ready queue only as the replacement supports (append, popleft, clear, len, bool),
    and the selector loop still starts serving through `_start_serving`. Where this fails, the
    priority loop must learn the new use or fall back to FIFO on that version."""
    used = set(re.findall(r"self\._ready\.(\w+)", inspect.getsource(asyncio.base_events)))
    assert used and used <= {"append", "popleft", "clear"}, used
    assert all(hasattr(TwoLevelReadyQueue, op) for op in used | {"__len__", "__bool__"})
    assert callable(getattr(asyncio.SelectorEventLoop, "_start_serving", None))


def _fifo_fallback_loop() -> asyncio.AbstractEventLoop:
    """The fallback as it runs: a PriorityEventLoop that kept asyncio's own ready deque."""
    loop = PriorityEventLoop()
    loop._ready = collections.deque()  # type: ignore[attr-defined]
    return loop


def _recording(gw: Any, monkeypatch: pytest.MonkeyPatch) -> tuple[list[bool], list[bool]]:
    """Whether each worker call was opened urgent, and each chunk relayed urgent."""
    opened: list[bool] = []
    relayed: list[bool] = []
    real_stream, real_account = gw.service.stream, RequestLifecycle.account

    def stream(*args: Any, **kwargs: Any) -> Any:
        opened.append(URGENT.get())
        return real_stream(*args, **kwargs)

    def account(self: RequestLifecycle, chunk: Any) -> None:
        relayed.append(URGENT.get())
        real_account(self, chunk)

    gw.service.stream = stream
    monkeypatch.setattr(RequestLifecycle, "account", account)
    return opened, relayed


async def test_a_light_tenants_request_runs_urgent_and_a_wide_or_busy_tenants_does_not(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async with gateway(tmp_path, [lambda state: FakeServicer(state, 0.001)]) as gw:
        seen, relayed = _recording(gw, monkeypatch)
        r = await gw.client.post("/v1/completions", headers=gw.headers(),
                                 json={"model": "m", "prompt": "a", "max_tokens": 1})
        assert r.status_code == 200, r.text
        assert seen == [True] and relayed == [True]
        seen.clear()
        relayed.clear()
        # 64 streams at once: a big tenant's request (it waits for the shared slots, too). The
        # admission gate marked it urgent (its key is recent and its tenant holds nothing); its
        # relaying, in the request's own task, must not stay so.
        r = await gw.client.post("/v1/completions", headers=gw.headers(),
                                 json={"model": "m", "prompt": ["a"] * 16, "n": 4, "max_tokens": 1})
        assert r.status_code == 200, r.text
        assert seen == [False] * 64 and relayed == [False] * 64
        seen.clear()
        # A tenant that already holds the reserve's share of slots is not light either.
        scheduler = gw.service.admission.scheduler
        scheduler.running["acme"] += scheduler.small
        scheduler.total_running += scheduler.small
        try:
            r = await gw.client.post("/v1/completions", headers=gw.headers(),
                                     json={"model": "m", "prompt": "a", "max_tokens": 1})
        finally:
            scheduler.done("acme", scheduler.small)
        assert r.status_code == 200, r.text
        assert seen == [False]


async def test_the_gate_marks_a_known_keys_request_by_its_tenants_load() -> None:
    light: dict[str, bool] = {"quiet": True, "bulk": False}
    service = SimpleNamespace(
        catalog=SimpleNamespace(recent_key=lambda secret: None,
                                tenant_hint=lambda secret: secret if secret in light else None),
        admissions=SimpleNamespace(early_refusal=lambda key: None),
        admission=SimpleNamespace(light=lambda tenant, streams=1: light[tenant]))
    seen: list[bool] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen.append(URGENT.get())

    gate = AdmissionGate(app, service)  # type: ignore[arg-type]
    for connection_urgent in (False, True):
        mark_urgent(connection_urgent)  # what a request inherits from its connection
        for secret in ("quiet", "bulk", "unknown"):
            scope = {"type": "http", "method": "POST", "path": "/v1/completions",
                     "headers": [(b"authorization", f"Bearer {secret}".encode())]}
            await asyncio.create_task(gate(scope, None, None))  # type: ignore[arg-type]  # a task each, as uvicorn runs them
    mark_urgent(False)
    # A key not known yet keeps its connection's mark until its lifecycle settles it.
    assert seen == [True, False, False, True, False, True]


def test_a_new_connection_and_its_reads_are_urgent_and_other_work_is_not() -> None:
    seen: dict[str, bool] = {}

    async def main() -> None:
        got = asyncio.Event()

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            seen["connection"] = URGENT.get()
            await reader.readexactly(5)
            seen["after a read"] = URGENT.get()
            writer.close()
            got.set()

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        seen["serving task"] = URGENT.get()
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"hello")
        await writer.drain()
        await asyncio.wait_for(got.wait(), 5)
        writer.close()
        server.close()
        await server.wait_closed()

    _run(main())
    assert seen == {"serving task": False, "connection": True, "after a read": True}
