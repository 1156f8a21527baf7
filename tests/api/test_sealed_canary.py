"""The canary: a unique string sent in sealed mode through the full stack in fleet mode (gateway,
worker, key broker, PostgreSQL, Redis), in stored responses and a sealed-mode conversation too, is
found in no log, file, database row, Redis value or audit entry, not in a capture of the gateway's
traffic, and not in the gateway process's memory. The same test in plaintext mode finds it where it
must be (traffic, gateway memory), so the test can fail."""

from __future__ import annotations

import contextlib
import json
import re
import secrets
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any
from typing import Any as RunningStack

import openai
import pytest
from sqlalchemy import create_engine, text

from api.home import Home
from api.stack import DEMO_MODEL, free_port, launch
from sealed_client import SealedOpenAI
from tests.api.conftest import copy_home
from tests.api.fleet import REDIS_URL, postgres_database, redis_client
from tests.api.sealed_helpers import demo_client_policy


class Recorder:
    """A TCP relay in front of the gateway that keeps every byte in both directions."""

    def __init__(self, target_port: int) -> None:
        self.target_port, self.captured = target_port, bytearray()
        self._lock = threading.Lock()
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port = self._server.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.target_port))
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                with self._lock:
                    self.captured += data
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self._server.close()


def in_process_memory(pid: int, needle: bytes) -> bool:
    """Whether `needle` is anywhere in the readable memory of process `pid` (needs ptrace rights)."""
    found = False
    with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/mem", "rb", 0) as mem:
        for line in maps:
            m = re.match(r"([0-9a-f]+)-([0-9a-f]+) (\S+)", line)
            if not m or m.group(3)[0] != "r" or "[vvar]" in line or "[vsyscall]" in line:
                continue
            start, end = int(m.group(1), 16), int(m.group(2), 16)
            try:
                mem.seek(start)
                chunk = mem.read(end - start)
            except (OSError, ValueError, OverflowError):
                continue
            if needle in chunk:
                found = True
                break
    return found


@pytest.fixture(scope="module")
def pg_url() -> Iterator[str]:
    yield from postgres_database()


@pytest.fixture(scope="module")
def fleet(stack: RunningStack, pg_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    redis = redis_client()
    redis.flushdb()
    root = tmp_path_factory.mktemp("fleet")
    copy_home(stack.home, root)
    home = Home(root)
    home.create()
    running = launch(home, port=free_port(), gateway_args=("--database-url", pg_url, "--redis-url", REDIS_URL))
    try:
        assert running.wait_ready(timeout=300) == "ready"
        deadline = time.monotonic() + 60
        import httpx

        while httpx.get(f"{running.gateway_url}/readyz", timeout=2).status_code != 200:
            assert time.monotonic() < deadline, "gateway never ready"
            time.sleep(0.5)
        recorder = Recorder(int(running.gateway_url.rsplit(":", 1)[1]))
        yield home, running, recorder, redis, pg_url
        recorder.close()
    finally:
        running.stop()


def _everywhere_at_rest(home: Home, redis: Any, pg_url: str, needle: str) -> list[str]:
    """Every place at rest where the needle is found: files (logs, audit, state), database rows, Redis."""
    hits = []
    for path in home.root.rglob("*"):
        if path.is_file() and needle.encode() in path.read_bytes():
            hits.append(str(path))
    engine = create_engine(pg_url)
    with engine.connect() as conn:
        tables = [r[0] for r in conn.execute(text(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'"))]
        for table in tables:
            for row in conn.execute(text(f'SELECT * FROM "{table}"')):
                if needle in json.dumps([str(v) for v in row]):
                    hits.append(f"postgres:{table}")
    engine.dispose()
    for key in redis.scan_iter():
        kind = redis.type(key).decode()
        value = {"string": lambda k: redis.get(k), "hash": lambda k: redis.hgetall(k),
                 "list": lambda k: redis.lrange(k, 0, -1), "set": lambda k: redis.smembers(k),
                 "zset": lambda k: redis.zrange(k, 0, -1)}.get(kind, lambda k: b"")(key)
        if needle.encode() in key or needle in repr(value):
            hits.append(f"redis:{key!r}")
    return hits


def test_sealed_canary_is_nowhere_outside_the_worker_and_plaintext_is_where_expected(fleet: Any) -> None:
    home, running, recorder, redis, pg_url = fleet
    key = (home.root / "demo" / "api-key").read_text().strip()
    gateway_pid = running.pid("gateway")
    url = f"http://127.0.0.1:{recorder.port}/v1"

    sealed_canary = f"canary-sealed-{secrets.token_hex(12)}"
    client = SealedOpenAI(base_url=url, api_key=key, max_retries=0, policy=demo_client_policy(home.root))
    for stream in (False, True):
        out = client.chat.completions.create(model=DEMO_MODEL, max_tokens=8, temperature=0, stream=stream, messages=[
            {"role": "user", "content": f"Repeat after me: {sealed_canary}"}])
        if stream:
            list(out)
    for stream in (False, True):  # the Responses API is sealed the same way (responses.create, .stream)
        answer = client.responses.create(model=DEMO_MODEL, max_output_tokens=8, temperature=0, stream=stream,
                                         input=f"Repeat after me: {sealed_canary}")
        if stream:
            list(answer)
    # Stored (the default) and continued: the gateway keeps the worker-sealed state in PostgreSQL.
    stored = client.responses.create(model=DEMO_MODEL, max_output_tokens=8, temperature=0,
                                     input=f"Remember this: {sealed_canary}")
    client.responses.create(model=DEMO_MODEL, max_output_tokens=8, temperature=0, previous_response_id=stored.id,
                            input=f"And this: {sealed_canary}")
    # A conversation made in sealed mode, and a turn in it: the gateway keeps one worker-sealed blob.
    conv = client.conversations.create(items=[{"role": "user", "content": f"Remember: {sealed_canary}"}],
                                       extra_body={"model": DEMO_MODEL})
    client.responses.create(model=DEMO_MODEL, max_output_tokens=8, temperature=0, conversation=conv.id,
                            input=f"And this: {sealed_canary}")
    items = client.conversations.items.list(conv.id, order="asc")
    assert json.dumps(items.model_dump()).count(sealed_canary) == 2  # the client reads it back, sealed
    with create_engine(pg_url).connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM response_states WHERE id = :i"), {"i": stored.id}).scalar() == 1
        assert conn.execute(text("SELECT count(*) FROM conversations WHERE id = :i AND sealed_state IS NOT NULL"),
                            {"i": conv.id}).scalar() == 1
    assert len(client.sealed.receipts) == 9
    time.sleep(1.5)  # usage rows and logs are written after the answer
    assert not _everywhere_at_rest(home, redis, pg_url, sealed_canary)
    assert sealed_canary.encode() not in recorder.captured
    assert not in_process_memory(gateway_pid, sealed_canary.encode())
    with create_engine(pg_url).connect() as conn:  # metered all the same, from the worker's signed usage
        assert conn.execute(text("SELECT count(*) FROM usage")).scalar() >= 4

    plain_canary = f"canary-plain-{secrets.token_hex(12)}"
    plain = openai.OpenAI(base_url=url, api_key=key, max_retries=0)
    plain.chat.completions.create(model=DEMO_MODEL, max_tokens=8, temperature=0, messages=[
        {"role": "user", "content": f"Repeat after me: {plain_canary}"}])
    time.sleep(1.5)
    assert plain_canary.encode() in recorder.captured  # the gateway's traffic carries plaintext
    assert in_process_memory(gateway_pid, plain_canary.encode())  # and its memory held the prompt
    assert not _everywhere_at_rest(home, redis, pg_url, plain_canary)  # never logged or stored, either way
