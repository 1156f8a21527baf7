"""Audit exports: JSON Lines (entries exactly as logged), CSV, and OCSF (mapping: policy/audit/ocsf.py)."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterable, Iterator

from policy.audit import AuditEntry
from policy.audit.entry import format_ts
from policy.audit.ocsf import deciding_rule as _rule
from policy.audit.ocsf import ocsf_event

CSV_FIELDS = ("ts", "component", "seq", "tenant", "action", "decision", "rule", "reason", "metadata", "hash")

CHUNK = 500  # lines per chunk sent: one send per line costs more than the encoding


def _chunked(lines: Iterable[str]) -> Iterator[str]:
    batch: list[str] = []
    for line in lines:
        batch.append(line)
        if len(batch) >= CHUNK:
            yield "".join(batch)
            batch.clear()
    if batch:
        yield "".join(batch)


def jsonl_lines(entries: Iterable[AuditEntry]) -> Iterator[str]:
    """Each entry exactly as logged (hash and signature included), so every line still verifies."""
    return _chunked(e.to_json() + "\n" for e in entries)


def csv_chunks(entries: Iterable[AuditEntry]) -> Iterator[str]:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(CSV_FIELDS)
    for n, e in enumerate(entries, 1):
        writer.writerow([format_ts(e.ts), e.component, e.seq, e.tenant, e.action, e.decision, _rule(e),
                         e.reason, json.dumps(dict(e.metadata), sort_keys=True), e.hash])
        if n % 500 == 0:
            yield buf.getvalue()
            buf.seek(0)
            buf.truncate()
    yield buf.getvalue()


def ocsf_lines(entries: Iterable[AuditEntry]) -> Iterator[str]:
    """One OCSF event per line (NDJSON), what SIEM collectors ingest."""
    return _chunked(json.dumps(ocsf_event(e), sort_keys=True, separators=(",", ":")) + "\n" for e in entries)
