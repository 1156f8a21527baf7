"""`sealed up` starts a child again on new ports when a port chosen for it was bound by another
process first (api/stack_children.py `on_free_ports`): free_port() checks a port is free at that moment, and
a worker imports torch for seconds before it binds (a busy test run saw a worker's gRPC bind fail)."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from api.ports import free_port
from api.stack_children import PORT_TRIES, on_free_ports, wait_http
from api.supervisor import Supervisor


@pytest.fixture()
def taken() -> Iterator[int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield int(s.getsockname()[1])


def _web(sup: Supervisor, ports: Iterator[int], started: list[int]):  # type: ignore[no-untyped-def]
    def start() -> str:
        port = next(ports)
        started.append(port)
        child = sup.start("web", ["http.server", str(port), "--bind", "127.0.0.1"])
        wait_http(f"http://127.0.0.1:{port}/", child)
        return f"http://127.0.0.1:{port}"
    return start


def test_a_child_whose_port_was_taken_starts_again_on_another(tmp_path: Path, taken: int) -> None:
    sup = Supervisor(tmp_path)
    started: list[int] = []
    try:
        url = on_free_ports(sup, "web", _web(sup, iter([taken, free_port()]), started))
        assert started[0] == taken and url == f"http://127.0.0.1:{started[1]}"
        assert sup.children["web"].proc.poll() is None and sup.children["web"].restarts == 0
    finally:
        sup.stop()


def test_it_gives_up_after_a_few_tries_and_says_so(tmp_path: Path, taken: int) -> None:
    sup = Supervisor(tmp_path)
    try:
        with pytest.raises(RuntimeError, match=f"no free port after {PORT_TRIES} tries"):
            on_free_ports(sup, "web", _web(sup, iter([taken] * PORT_TRIES), []))
        assert "web" not in sup.children
    finally:
        sup.stop()


def test_any_other_exit_is_not_retried(tmp_path: Path) -> None:
    sup = Supervisor(tmp_path)
    tries: list[int] = []

    def start() -> str:
        tries.append(1)
        child = sup.start("web", ["json.tool", "/nonexistent"])  # exits at once, for another reason
        wait_http("http://127.0.0.1:9/", child)
        return ""

    try:
        with pytest.raises(RuntimeError, match="web exited with"):
            on_free_ports(sup, "web", start)
        assert len(tries) == 1
    finally:
        sup.stop()
