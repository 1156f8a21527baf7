"""Helpers of the tests that start their own `sealed up`: wait until it is ready, and keep the
demo tenant asking while something else happens."""

from __future__ import annotations

import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import openai

from api.stack import DEMO_MODEL


def wait_ready(proc: subprocess.Popen, url: str, log: Path, timeout: float = 420.0) -> None:
    """Return once `url`/readyz answers 200; fail with the log's tail if `sealed up` exits first,
    raise TimeoutError if it is not ready within `timeout` (the caller stops it)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text()[-3000:]
        try:
            if httpx.get(f"{url}/readyz", timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise TimeoutError("stack did not become ready")


@dataclass
class ChatTraffic:
    """Clients asking the demo model one after another on `threads` threads, `pause_s` apart; counts
    what succeeded and what failed. A context manager, or start() and stop()."""

    url: str
    api_key: str
    max_tokens: int = 4
    timeout: float = 60.0
    threads: int = 1
    pause_s: float = 0.0  # after each answer
    error_pause_s: float = 0.2  # after each error
    ok: int = 0
    errors: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)

    def _run(self) -> None:
        client = openai.OpenAI(base_url=f"{self.url}/v1", api_key=self.api_key, max_retries=0, timeout=self.timeout)
        while not self._stop.is_set():
            try:
                client.chat.completions.create(model=DEMO_MODEL, messages=[{"role": "user", "content": "Hi"}],
                                               max_tokens=self.max_tokens, temperature=0)
                self.ok += 1
                self._stop.wait(self.pause_s)
            except openai.APIError as exc:
                self.errors.append(type(exc).__name__)  # the kind: tests compare it with what may fail
                self._stop.wait(max(self.pause_s, self.error_pause_s))

    def start(self) -> ChatTraffic:
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(self.threads)]
        for t in self._threads:
            t.start()
        return self

    def wait_for(self, count: int, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while self.ok < count:
            assert time.monotonic() < deadline, f"only {self.ok} answers, errors {self.errors}"
            time.sleep(0.1)

    def stop(self, join_s: float = 90.0) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(join_s)

    def __enter__(self) -> ChatTraffic:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()
