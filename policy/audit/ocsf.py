"""The OCSF mapping of an audit entry, shared by the console's exports and the SIEM forwarder.

OCSF mapping (schema 1.3.0): every entry is an **API Activity** event (class_uid 6003, category
6 Application Activity): each is one call to a Sealed component's API (a key release, an
admission, a management change, an in-enclave check) with an actor, an operation and an
outcome. ``status_id`` is 1 (Success) for allow and 2 (Failure) for deny or refused; the deny
reason is ``status_detail``; the deciding rule, policy and other metadata go to ``unmapped``;
``metadata.uid`` is the entry's chain hash so a SIEM row can be traced back to the signed entry.
With ``raw=True`` (what the forwarder sends) ``raw_data`` holds the signed entry exactly as logged,
so the chain and its signatures can be verified from what the SIEM received.
"""

from __future__ import annotations

from typing import Any

from policy.audit.entry import AuditEntry, format_ts

OCSF_VERSION = "1.3.0"
OCSF_CLASS_UID = 6003  # API Activity
OCSF_CATEGORY_UID = 6  # Application Activity

# activity_id of API Activity: 1 Create, 2 Read, 3 Update, 4 Delete, 99 Other
_ACTIVITY = {"create": 1, "release": 2, "read": 2, "get": 2, "status": 2, "update": 3, "put": 3, "rotate": 3,
             "revoke": 4, "delete": 4}


def activity_id(action: str) -> int:
    for word, activity in _ACTIVITY.items():
        if word in action.lower():
            return activity
    return 99


def deciding_rule(entry: AuditEntry) -> str:
    return str(entry.metadata.get("rule") or entry.reason)


def ocsf_event(e: AuditEntry, *, raw: bool = False) -> dict[str, Any]:
    activity = activity_id(e.action)
    allowed = e.decision == "allow"
    event: dict[str, Any] = {
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
        "unmapped": {"decision": e.decision, "rule": deciding_rule(e),
                     **{f"metadata.{k}": v for k, v in e.metadata.items()}},
    }
    if raw:
        event["raw_data"] = e.to_json()
        event["unmapped"]["prev"] = e.prev
    return event
