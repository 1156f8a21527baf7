"""Helpers the benchmarks share for the real processes they start."""

from __future__ import annotations

import subprocess
import time

import httpx


def wait_healthy(proc: subprocess.Popen, url: str, timeout_s: float = 60.0) -> None:
    """Return once `url`/healthz answers 200; kill the process and raise if it never does."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{url}: the process exited with {proc.returncode} before it was healthy")
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"{url}: not healthy after {timeout_s:.0f} s")
