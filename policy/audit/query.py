"""Reading, filtering and exporting audit entries, and the tenant-scoped auditor view.

Queries read files as written and do not verify signatures (call ``verify_log`` for that);
a torn final line from a crash is skipped.
"""

from __future__ import annotations

import heapq
import io
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import TextIO

from policy.audit.entry import AuditEntry, parse_entry
from policy.audit.verify import log_files


def _iter_file(path: Path) -> Iterator[AuditEntry]:
    with open(path, encoding="ascii", errors="replace") as fh:
        for index, line in enumerate(fh):
            if not line.endswith("\n"):
                return  # torn tail left by a crash
            yield parse_entry(line, index, str(path))[0]


def _matches(e: AuditEntry, tenant: str | None, since: datetime | None, component: str | None,
             decision: str | None) -> bool:
    return ((tenant is None or e.tenant == tenant) and (since is None or e.ts >= since)
            and (component is None or e.component == component)
            and (decision is None or e.decision == decision))


def read_entries(path: Path, *, tenant: str | None = None, since: datetime | None = None,
                 component: str | None = None, decision: str | None = None) -> list[AuditEntry]:
    """Entries of one log file (or every log of a directory, merged by time) matching all filters."""
    path = Path(path)
    if since is not None and since.tzinfo is None:
        since = since.replace(tzinfo=UTC)  # entries are UTC; a naive bound is read as UTC, not local
    files = log_files(path) if path.is_dir() else [path]
    streams = [(e for e in _iter_file(f) if _matches(e, tenant, since, component, decision))
               for f in files]
    # Each file is in time order already; a k-way merge keeps the combined view in time order.
    return list(heapq.merge(*streams, key=lambda e: (e.ts, e.component, e.seq)))


def read_dir(directory: Path, **filters: object) -> list[AuditEntry]:
    """All logs of a shared audit directory, merged in time order (same filters as read_entries)."""
    return read_entries(Path(directory), **filters)  # type: ignore[arg-type]


def auditor_entries(directory: Path, auditor_tenant: str, *, since: datetime | None = None,
                    component: str | None = None, decision: str | None = None) -> list[AuditEntry]:
    """What a tenant's auditor may see: that tenant's entries only, never another tenant's.

    The tenant filter is not optional here, and results are re-checked after filtering so that
    a future change to the filters cannot leak another tenant's rows.
    """
    if not auditor_tenant:
        raise ValueError("auditor_tenant is required")
    rows = read_entries(Path(directory), tenant=auditor_tenant, since=since, component=component,
                        decision=decision)
    return [e for e in rows if e.tenant == auditor_tenant]


def write_jsonl(entries: list[AuditEntry], out: TextIO) -> int:
    """Write entries as JSONL exactly as logged (so exported lines still verify individually)."""
    for e in entries:
        out.write(e.to_json() + "\n")
    return len(entries)


def export_jsonl(directory: Path, *, tenant: str, since: datetime | None = None,
                 component: str | None = None, decision: str | None = None) -> str:
    """A tenant's filtered entries as a JSONL string."""
    buf = io.StringIO()
    write_jsonl(auditor_entries(directory, tenant, since=since, component=component,
                                decision=decision), buf)
    return buf.getvalue()
