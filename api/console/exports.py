"""Audit exports: JSON Lines (entries exactly as logged), CSV, and OCSF.

OCSF mapping (schema 1.3.0): every entry is an **API Activity** event (class_uid 6003, category
6 Application Activity): each is one call to a Sealed component's API (a key release, an
admission, a management change, an in-enclave check) with an actor, an operation and an
outcome. ``status_id`` is 1 (Success) for allow and 2 (Failure) for deny or refused; the deny
reason is ``status_detail``; the deciding rule, policy and other metadata go to ``unmapped``;
``metadata.uid`` is the entry's chain hash so a SIEM row can be traced back to the signed entry.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterable, Iterator
from typing import Any

from policy.audit import AuditEntry
from policy.audit.entry import format_ts

OCSF_VERSION = "1.3.0"
OCSF_CLASS_UID = 6003  # API Activity
OCSF_CATEGORY_UID = 6  # Application Activity
CSV_FIELDS = ("ts", "component", "seq", "tenant", "action", "decision", "rule", "reason", "metadata", "hash")

# activity_id of API Activity: 1 Create, 2 Read, 3 Update, 4 Delete, 99 Other
_ACTIVITY = {"create": 1, "release": 2, "read": 2, "get": 2, "status": 2, "update": 3, "put": 3, "rotate": 3,
             "revoke": 4, "delete": 4}


def _activity_id(action: str) -> int:
    for word, activity in _ACTIVITY.items():
        if word in action.lower():
            return activity
    return 99


def _rule(entry: AuditEntry) -> str:
    return str(entry.metadata.get("rule") or entry.reason)


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


def ocsf_event(e: AuditEntry) -> dict[str, Any]:
    activity = _activity_id(e.action)
    allowed = e.decision == "allow"
    return {
        "class_uid": OCSF_CLASS_UID, "class_name": "API Activity",
        "category_uid": OCSF_CATEGORY_UID, "category_name": "Application Activity",
        "activity_id": activity, "type_uid": OCSF_CLASS_UID * 100 + activity,
        "time": int(e.ts.timestamp() * 1000),
        "severity_id": 1 if allowed else 3,  # Informational / Medium
        "status_id": 1 if allowed else 2, "status": "Success" if allowed else "Failure",
        "status_detail": e.reason,
        "message": f"{e.component} {e.action}: {e.decision}",
        "metadata": {"version": OCSF_VERSION, "uid": e.hash, "sequence": e.seq, "tenant_uid": e.tenant,
                     "original_time": format_ts(e.ts), "log_name": f"{e.component}.audit.jsonl",
                     "product": {"name": "Sealed", "vendor_name": "Sealed", "feature": {"name": e.component}}},
        "actor": {"app_name": e.component},
        "api": {"operation": e.action, "service": {"name": e.component}},
        "src_endpoint": {"name": e.component},
        "cloud": {"provider": "Sealed", "account": {"uid": e.tenant}},
        "unmapped": {"decision": e.decision, "rule": _rule(e), **{f"metadata.{k}": v for k, v in e.metadata.items()}},
    }


def ocsf_lines(entries: Iterable[AuditEntry]) -> Iterator[str]:
    """One OCSF event per line (NDJSON), what SIEM collectors ingest."""
    return _chunked(json.dumps(ocsf_event(e), sort_keys=True, separators=(",", ":")) + "\n" for e in entries)
