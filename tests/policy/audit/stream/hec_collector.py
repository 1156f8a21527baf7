"""The tests' HEC-style collector as its own process, so a test can kill -9 it: every batch is
written to a JSON Lines file (its "index") before the batch is acknowledged, as a SIEM stores an
event before it answers. A kill -9 mid-write leaves an unterminated last line, which the next start
cuts off (that batch was never acknowledged, so the forwarder sends it again).

    python -m tests.policy.audit.stream.hec_collector --port P --pki DIR --out FILE   (token: $HEC_TOKEN)
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import threading
from pathlib import Path
from typing import Any

from tests.policy.audit.stream.receivers import HecCollector, Pki

TOKEN_ENV = "HEC_TOKEN"


def cut_torn_tail(path: Path) -> None:
    """Drop what follows the last newline (a batch the previous process did not finish writing)."""
    if not path.exists():
        return
    data = path.read_bytes()
    keep = data.rfind(b"\n") + 1
    if keep != len(data):
        os.truncate(path, keep)


def read_index(path: Path) -> list[dict[str, Any]]:
    """Every event the collector stored, in arrival order (complete lines only)."""
    if not path.exists():
        return []
    data = path.read_bytes()
    return [json.loads(line) for line in data[:data.rfind(b"\n") + 1].splitlines()]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--pki", type=Path, required=True, help="directory with server.pem and server.key")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    cut_torn_tail(args.out)
    fd = os.open(args.out, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    lock = threading.Lock()

    def store(events: list[dict[str, Any]]) -> None:
        data = "".join(json.dumps(e, sort_keys=True) + "\n" for e in events).encode("utf-8")
        with lock:  # one batch's lines together, whatever the handler threads do
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]

    pki = Pki(args.pki / "ca.pem", args.pki / "server.pem", args.pki / "server.key")
    collector = HecCollector(os.environ[TOKEN_ENV], pki, args.port, sink=store)
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    print(f"listening on {collector.port}", flush=True)
    done.wait()
    collector.stop()
    os.close(fd)


if __name__ == "__main__":
    main()
