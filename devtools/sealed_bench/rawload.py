"""A cheap streaming load client for the flood benchmark: HTTP/1.1 over asyncio streams.

Five hundred httpx streams in one Python process cost the load generator more CPU than the gateway
it measures (on a 2-core machine they compete). This client writes the request, reads the answer
in large blocks and only looks for the status line and the final ``data: [DONE]`` event; the
quiet tenant's latency is measured with httpx in a process of its own (bench_flood).
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field

DONE = b"data: [DONE]"


@dataclass
class Tally:
    status: dict[str, int] = field(default_factory=dict)
    choices_done: int = 0

    def saw(self, status: int | str) -> None:
        self.status[str(status)] = self.status.get(str(status), 0) + 1


async def stream_once(host: str, port: int, path: str, key: str, body: dict, choices: int, tally: Tally) -> bool:
    """One streamed POST on a fresh connection; True when it completed with [DONE]."""
    payload = json.dumps({**body, "stream": True}).encode()
    head = (f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nAuthorization: Bearer {key}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\nConnection: close\r\n\r\n")
    try:
        reader, writer = await asyncio.open_connection(host, port)
    except OSError as exc:
        tally.saw(type(exc).__name__)
        return False
    try:
        writer.write(head.encode() + payload)
        await writer.drain()
        status_line = await reader.readline()
        try:
            status = int(status_line.split()[1])
        except (IndexError, ValueError):
            tally.saw("bad-status-line")
            return False
        tail = b""
        while block := await reader.read(65536):
            tail = (tail + block)[-64:]  # [DONE] is in the last event; keep just enough to see it
        if status != 200:
            tally.saw(status)
            return False
        if DONE not in tail:
            tally.saw("incomplete")
            return False
        tally.saw(200)
        tally.choices_done += choices
        return True
    except (OSError, asyncio.IncompleteReadError) as exc:
        tally.saw(type(exc).__name__)
        return False
    finally:
        writer.close()


async def plain_get(host: str, port: int, path: str, key: str) -> int:
    """One GET on a fresh connection; its status (the 401 client uses it)."""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nAuthorization: Bearer {key}\r\n"
                     "Connection: close\r\n\r\n".encode())
        await writer.drain()
        status = int((await reader.readline()).split()[1])
        while await reader.read(65536):
            pass
        return status
    finally:
        writer.close()
