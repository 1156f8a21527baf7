"""Management actions (tenants, keys, models, policies, kill switch, revocations) in the gateway's
audit trail: who did what to which tenant. Names, ids and numbers only, never secrets."""

from __future__ import annotations

from typing import Any

from api.management.auth import Principal
from policy.audit import AuditLog


def audit_admin(audit: AuditLog, who: Principal, tenant: str, action: str, **meta: Any) -> None:
    """One management action by `who`; `meta` keeps scalars only (a list or a secret object is dropped)."""
    scalars = {k: v for k, v in meta.items() if v is None or isinstance(v, str | int | float | bool)}
    audit.append(
        tenant=tenant or "-",
        action=action,
        decision="allow",
        reason="management",
        metadata={"principal": who.subject, "role": who.role, **scalars},
    )
