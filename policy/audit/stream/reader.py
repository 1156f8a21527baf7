"""Read a log's entries after a cursor position: complete lines only, chain continuity checked.

The writer appends one whole line per entry; a line without its newline is still being written
(or torn by a crash, which the writer drops when it restarts), so it is left for the next read.
"""

from __future__ import annotations

import os
from pathlib import Path

from policy.audit.entry import AuditEntry, parse_entry
from policy.audit.stream.cursor import Position
from policy.errors import AuditIntegrityError

READ_CHUNK = 1 << 20


def read_after(path: Path, start: Position, limit: int) -> list[tuple[AuditEntry, Position]]:
    """Up to ``limit`` entries from ``start``, each with the position just after it.

    Raises AuditIntegrityError where the file no longer holds what the cursor saw (a log cut back
    or rewritten): forwarding a different history silently would defeat the chain.
    """
    out: list[tuple[AuditEntry, Position]] = []
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return out
    try:
        size = os.fstat(fd).st_size
        if size < start.offset:
            raise AuditIntegrityError(start.seq, f"log is {size} bytes, shorter than the forwarded "
                                      f"{start.offset}", str(path))
        offset, seq, prev = start.offset, start.seq, start.prev
        pending = b""
        while len(out) < limit and offset + len(pending) < size:
            chunk = os.pread(fd, READ_CHUNK, offset + len(pending))
            if not chunk:
                break
            pending += chunk
            while len(out) < limit:
                end = pending.find(b"\n")
                if end < 0:
                    break
                line, pending = pending[:end], pending[end + 1:]
                entry, _ = parse_entry(line, seq, str(path))
                if entry.seq != seq or entry.prev != prev:
                    raise AuditIntegrityError(seq, "chain broken after the forwarded position", str(path))
                offset += end + 1
                seq, prev = seq + 1, entry.hash
                out.append((entry, Position(seq, offset, prev)))
            if len(pending) >= READ_CHUNK * 4:  # a line this long is no entry the writer makes
                raise AuditIntegrityError(seq, "line too long", str(path))
    finally:
        os.close(fd)
    return out
