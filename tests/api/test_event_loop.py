"""The gateway's event loop: asyncio's with priorities (priority_loop.py) unless uvloop is asked for
(`--loop uvloop`, optional); and grpc.aio, the gateway's worker channels, streams and cancels on each
loop as on asyncio's own (the uvloop case runs where uvloop is installed)."""

from __future__ import annotations

import asyncio
import importlib.util
import sys
from collections.abc import AsyncIterator, Callable

import grpc
import pytest

from api import http_server
from api.gateway.grpc_client import WorkerClients
from api.gateway.priority_loop import PriorityEventLoop
from api.http_server import LOOP_FACTORIES, event_loop, server_config, shorten_gil_switch_interval
from api.serve import main as gateway_main
from api.stack import free_port
from protocol.rpc import worker_pb2, worker_pb2_grpc


async def _app(scope: object, receive: object, send: object) -> None:  # an ASGI app that never runs
    raise AssertionError


def _without_uvloop(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(http_server.importlib.util, "find_spec",
                        lambda name, *a: None if name == "uvloop" else real(name, *a))


def test_auto_is_the_priority_loop_even_where_uvloop_is_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    """uvloop has no priorities: an optional package that happens to be installed must not turn them off."""
    real = importlib.util.find_spec
    monkeypatch.setattr(http_server.importlib.util, "find_spec",
                        lambda name, *a: object() if name == "uvloop" else real(name, *a))  # "installed"
    assert event_loop("auto") == "asyncio"
    assert server_config(_app, "127.0.0.1", 1).loop == LOOP_FACTORIES["asyncio"]
    assert server_config(_app, "127.0.0.1", 1, loop="uvloop").loop == "uvloop"  # asked for: FIFO, by choice
    _without_uvloop(monkeypatch)
    assert event_loop("auto") == "asyncio"


def test_asyncio_is_asyncios_selector_loop_with_priorities_even_where_uvloop_is_installed() -> None:
    config = server_config(_app, "127.0.0.1", 1, loop="asyncio")
    factory = config.get_loop_factory()
    assert factory is PriorityEventLoop
    loop = factory()
    try:
        assert isinstance(loop, asyncio.SelectorEventLoop)
        assert "uvloop" not in type(loop).__module__
    finally:
        loop.close()


def test_uvloop_asked_for_but_missing_is_an_error_not_a_silent_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    _without_uvloop(monkeypatch)
    with pytest.raises(RuntimeError, match="uvloop is not installed"):
        event_loop("uvloop")


def test_the_gateway_command_takes_the_loop_choice() -> None:
    with pytest.raises(SystemExit):  # argparse refuses an unknown loop before anything starts
        gateway_main(["--data-dir", "/nonexistent", "--loop", "trio"])


def test_the_gil_switch_interval_is_set_and_bounded() -> None:
    before = sys.getswitchinterval()
    try:
        shorten_gil_switch_interval(0.001)
        assert sys.getswitchinterval() == pytest.approx(0.001)
        for bad in (0.0, -1.0, 0.5):
            with pytest.raises(ValueError, match="switch interval"):
                shorten_gil_switch_interval(bad)
        assert sys.getswitchinterval() == pytest.approx(0.001)  # a refused value changes nothing
    finally:
        sys.setswitchinterval(before)


class _Counting(worker_pb2_grpc.WorkerServicer):
    """Streams `max_tokens` chunks, 5 ms apart; records a generation cancelled by its client."""

    def __init__(self) -> None:
        self.cancelled = asyncio.Event()

    async def Generate(self, request: worker_pb2.GenerateRequest, context: grpc.aio.ServicerContext
                       ) -> AsyncIterator[worker_pb2.GenerateChunk]:
        try:
            for i in range(request.params.max_tokens):
                await asyncio.sleep(0.005)
                yield worker_pb2.GenerateChunk(text=f"{i} ", completion_tokens=i + 1)
        except asyncio.CancelledError:
            self.cancelled.set()
            raise


def _generate(tokens: int) -> worker_pb2.GenerateRequest:
    return worker_pb2.GenerateRequest(request_id="r", tenant="t", kind="completion", prompt="p",
                                      params=worker_pb2.SamplingParams(max_tokens=tokens))


async def _stream_and_cancel() -> tuple[list[int], bool]:
    servicer, server = _Counting(), grpc.aio.server()
    worker_pb2_grpc.add_WorkerServicer_to_server(servicer, server)
    address = f"127.0.0.1:{free_port()}"
    server.add_insecure_port(address)
    await server.start()
    clients = WorkerClients()
    try:
        # 20 concurrent streams read to the end, as the gateway relays them.
        async def whole() -> int:
            _first, rest = await clients.open(address, _generate(10), timeout_s=10)
            return 1 + len([c async for c in rest])

        counts = list(await asyncio.gather(*(whole() for _ in range(20))))
        # A client that leaves mid-stream cancels the worker's generation.
        _, rest = await clients.open(address, _generate(10_000), timeout_s=10)
        await anext(rest)
        await rest.aclose()  # type: ignore[attr-defined]
        await asyncio.wait_for(servicer.cancelled.wait(), 5)
        return counts, servicer.cancelled.is_set()
    finally:
        await clients.close()
        await server.stop(0)


def _loops() -> list[tuple[str, Callable[[], asyncio.AbstractEventLoop]]]:
    loops: list[tuple[str, Callable[[], asyncio.AbstractEventLoop]]] = [("asyncio", asyncio.new_event_loop),
                                                                       ("priority", PriorityEventLoop)]
    if importlib.util.find_spec("uvloop") is not None:
        import uvloop

        loops.append(("uvloop", uvloop.new_event_loop))
    return loops


@pytest.mark.parametrize("name,factory", _loops(), ids=[n for n, _ in _loops()])
def test_grpc_aio_streams_and_cancels_on_the_loop(name: str, factory: Callable[[], asyncio.AbstractEventLoop]
                                                  ) -> None:
    with asyncio.Runner(loop_factory=factory) as runner:
        assert (name == "uvloop") == ("uvloop" in type(runner.get_loop()).__module__)
        counts, cancelled = runner.run(_stream_and_cancel())
    assert counts == [10] * 20
    assert cancelled
