"""#13 finding 9: no header or idle timeout (1500 half-open connections were held for 40 s).

Raw sockets against the gateway's real uvicorn configuration, on 127.0.0.1 only and bounded:
half-open requests are closed after the header timeout, connections beyond the cap at once, headers
beyond the size bound are refused, and the gateway keeps answering. The gateway parses HTTP with
httptools (cheaper per request than h11, for the flood benchmark); every guard is tested on both
parsers, since the h11 one is the fallback where httptools is missing."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from api.app import create_app
from api.gateway.settings import GatewaySettings
from api.http_server import ConnectionLimits, server_config
from tests.security.harness import http_server

HALF_OPEN = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"  # no end


async def _closed_within(reader: asyncio.StreamReader, seconds: float) -> bool:
    try:
        while await asyncio.wait_for(reader.read(4096), seconds):
            pass  # a 4xx before closing is fine; then EOF
        return True
    except (TimeoutError, ConnectionError):
        return False


PARSERS = pytest.mark.parametrize("http", ["httptools", "h11"])


def test_the_gateway_parses_http_with_httptools(tmp_path: Path) -> None:
    config = server_config(create_app(GatewaySettings(data_dir=tmp_path, dev=True)), "127.0.0.1", 1,
                           ConnectionLimits())
    assert issubclass(config.http, HttpToolsProtocol)  # type: ignore[arg-type]


@PARSERS
async def test_half_open_connections_are_closed_and_capped(tmp_path: Path, http: str) -> None:
    app = create_app(GatewaySettings(data_dir=tmp_path, dev=True))
    async with http_server(app, http, header_timeout_s=1.0, max_connections=40) as url:
        port = int(url.rsplit(":", 1)[1])
        conns = []
        for _ in range(60):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(HALF_OPEN)
            await writer.drain()
            conns.append((reader, writer))
        # Beyond the cap: closed at accept.
        early = await asyncio.gather(*(_closed_within(r, 0.5) for r, _ in conns))
        assert sum(early) >= 20
        # The others: closed by the header timeout (1 s), not held (10x headroom: a hang guard,
        # the connections would otherwise stay open for good).
        late = await asyncio.gather(*(_closed_within(r, 10.0) for r, _ in conns))
        assert all(late), f"{late.count(False)} half-open connections still held"
        for _, writer in conns:
            writer.close()
        # An idle connection that never sends a byte is closed the same way.
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        assert await _closed_within(reader, 3.0)
        writer.close()
        async with httpx.AsyncClient() as client:
            assert (await client.get(f"{url}/healthz")).status_code == 200


@PARSERS
async def test_a_kept_alive_connection_gets_the_header_deadline_again(tmp_path: Path, http: str) -> None:
    app = create_app(GatewaySettings(data_dir=tmp_path, dev=True))
    async with http_server(app, http, header_timeout_s=1.0, keep_alive_s=30.0) as url:
        reader, writer = await asyncio.open_connection("127.0.0.1", int(url.rsplit(":", 1)[1]))
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        await writer.drain()
        assert b"200 OK" in await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        writer.write(b"GET /healthz HTTP/1.1\r\n")  # the second request never completes its headers
        await writer.drain()
        assert await _closed_within(reader, 3.0)
        writer.close()


@PARSERS
async def test_headers_beyond_the_size_bound_are_refused_at_once(tmp_path: Path, http: str) -> None:
    app = create_app(GatewaySettings(data_dir=tmp_path, dev=True))
    async with http_server(app, http, header_timeout_s=30.0, max_header_bytes=8192) as url:
        reader, writer = await asyncio.open_connection("127.0.0.1", int(url.rsplit(":", 1)[1]))
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Pad: ")
        for _ in range(4):  # a header value that goes on past the bound (then stops: no RST race),
            writer.write(b"a" * 2048)  # well within the header deadline
            await writer.drain()
            await asyncio.sleep(0.05)
        answer = await asyncio.wait_for(reader.read(), 5)  # answered and closed, not held for 30 s
        assert answer.startswith(b"HTTP/1.1 400"), answer[:80]
        writer.close()
        async with httpx.AsyncClient() as client:  # headers under the bound are served
            assert (await client.get(f"{url}/healthz", headers={"X-Pad": "a" * 4096})).status_code == 200
