"""The forwarding loop: for each destination, read what its cursor has not acknowledged, send it in
order, advance the cursor, and back off while the destination is down.

Destinations are independent (a cursor and a thread each), so a collector that is down holds back
only itself; the logs on disk are the buffer, so nothing in serving ever waits for a collector.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from policy.audit.entry import AuditEntry
from policy.audit.stream.cursor import Cursor
from policy.audit.stream.errors import DeliveryError, StreamConfigError
from policy.audit.stream.reader import read_after
from policy.errors import AuditIntegrityError

log = logging.getLogger(__name__)


class Sender(Protocol):
    name: str

    def send(self, entries: Sequence[AuditEntry]) -> None: ...


@dataclass(frozen=True)
class ForwardSettings:
    audit_dir: Path
    state_dir: Path  # one cursor file per destination
    components: tuple[str, ...] = ()  # which logs (<component>.audit.jsonl); empty: every log in audit_dir
    batch: int = 500
    poll_s: float = 1.0
    backoff_min_s: float = 0.5
    backoff_max_s: float = 60.0

    def __post_init__(self) -> None:
        if self.batch < 1 or self.poll_s <= 0 or not 0 < self.backoff_min_s <= self.backoff_max_s:
            raise StreamConfigError("batch >= 1, poll > 0 and 0 < backoff min <= max are required")

    def logs(self) -> list[Path]:
        if self.components:
            return [self.audit_dir / f"{c}.audit.jsonl" for c in self.components]
        return sorted(self.audit_dir.glob("*.audit.jsonl"))


class Forwarder:
    """One destination's forwarding; ``pump`` is one pass, ``run`` loops until ``stop``."""

    def __init__(self, settings: ForwardSettings, sender: Sender) -> None:
        self.settings = settings
        self.sender = sender
        self.cursor = Cursor(settings.state_dir / f"{sender.name}.cursor.json")
        self.sent = 0
        self.failures = 0
        self._stop = threading.Event()

    def pump(self) -> int:
        """Send every unacknowledged entry, batch by batch; returns how many were acknowledged.
        Raises DeliveryError (the cursor stays where the destination last acknowledged)."""
        total = 0
        for path in self.settings.logs():
            while True:
                batch = read_after(path, self.cursor.position(path.name), self.settings.batch)
                if not batch:
                    break
                self.sender.send([entry for entry, _ in batch])
                self.cursor.advance(path.name, batch[-1][1])
                total += len(batch)
                self.sent += len(batch)
        return total

    def run(self) -> None:
        delay = self.settings.backoff_min_s
        while not self._stop.is_set():
            try:
                self.pump()
            except DeliveryError as exc:
                self.failures += 1
                log.warning("audit forwarding to %s failed (retrying in %.1fs): %s", self.sender.name, delay, exc)
                self._stop.wait(delay)
                delay = min(delay * 2, self.settings.backoff_max_s)
                continue
            except AuditIntegrityError as exc:
                # A log that no longer holds what was forwarded is not forwarded further: an
                # operator must look (the SIEM's copy is the evidence).
                log.critical("audit forwarding to %s stopped: %s", self.sender.name, exc)
                raise
            delay = self.settings.backoff_min_s
            self._stop.wait(self.settings.poll_s)

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=self.run, name=f"audit-forward-{self.sender.name}", daemon=True)
        thread.start()
        return thread

    def stop(self) -> None:
        self._stop.set()
