"""free_port hands out listener ports below the kernel's ephemeral range (outgoing connections
cannot take them between the check and the server's bind)."""

from __future__ import annotations

import socket

from api.ports import _ephemeral_start, free_port


def test_ports_come_from_below_the_ephemeral_range_and_are_bindable() -> None:
    top = _ephemeral_start()
    for _ in range(20):
        port = free_port()
        assert 10000 <= port < top
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def test_a_port_someone_listens_on_is_never_handed_out() -> None:
    listeners = []
    try:
        for _ in range(50):
            s = socket.socket()
            s.bind(("127.0.0.1", free_port()))
            s.listen()
            listeners.append(s)
        taken = {s.getsockname()[1] for s in listeners}
        assert len(taken) == 50
        assert all(free_port() not in taken for _ in range(200))
    finally:
        for s in listeners:
            s.close()
