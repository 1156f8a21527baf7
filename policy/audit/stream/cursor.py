"""A destination's durable cursor: per log file, how many entries it has acknowledged.

One JSON file per destination, replaced atomically (temp file, fsync, rename): a forwarder killed
at any point resumes from the last batch its destination acknowledged, so an entry is delivered at
least once; one acknowledged but not yet recorded is delivered again with the same event id
(its chain hash), which the SIEM deduplicates.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from policy.audit.stream.errors import CursorError
from protocol.fsutil import atomic_write


@dataclass(frozen=True)
class Position:
    """Where a log's next unsent entry starts: its seq, its byte offset and the hash it chains to."""

    seq: int = 0
    offset: int = 0
    prev: str = "0" * 64


class Cursor:
    """The positions of one destination over every log it forwards."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._positions: dict[str, Position] = {}
        if path.exists():
            self._positions = self._load(path)

    @staticmethod
    def _load(path: Path) -> dict[str, Position]:
        try:
            raw = json.loads(path.read_text("utf-8"))
            return {str(log): Position(int(p["seq"]), int(p["offset"]), str(p["prev"]))
                    for log, p in raw["logs"].items()}
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise CursorError(f"cursor {path} is unreadable: {type(exc).__name__}") from None

    def position(self, log: str) -> Position:
        return self._positions.get(log, Position())

    def advance(self, log: str, position: Position) -> None:
        """Record an acknowledged batch durably before returning."""
        if position.seq < self.position(log).seq:
            raise CursorError(f"cursor for {log} cannot move back ({self.position(log).seq} -> {position.seq})")
        self._positions[log] = position
        body = {"logs": {name: {"seq": p.seq, "offset": p.offset, "prev": p.prev}
                         for name, p in sorted(self._positions.items())}}
        atomic_write(self.path, json.dumps(body, sort_keys=True).encode())
