"""A free TCP port for a process the stack or the control loop starts on this machine.

The port is picked below the kernel's ephemeral range: outgoing connections (database, Redis,
HTTP clients) take their local ports from that range, so a port found free there can be taken by
a connect() between this check and the server's own bind ("address already in use", seen when a
busy test suite started two gateways). Below the range only listeners compete.
"""

from __future__ import annotations

import secrets
import socket
from pathlib import Path

_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_LOWEST = 10000


def _ephemeral_start() -> int:
    try:
        return int(_RANGE_FILE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def _bindable(host: str, port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
        return True


def free_port(host: str = "127.0.0.1") -> int:
    top = _ephemeral_start()
    if top - _LOWEST >= 1000:
        for _ in range(64):
            port = _LOWEST + secrets.randbelow(top - _LOWEST)
            if _bindable(host, port):
                return port
    with socket.socket() as s:  # a narrowed ephemeral range: let the kernel choose
        s.bind((host, 0))
        return int(s.getsockname()[1])
