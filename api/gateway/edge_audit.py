"""The gateway's hook for refusals answered at its edge (401, 403, 404, 405, 413 and schema errors),
into the shared, flood-proof aggregate audit (`policy.audit.edge.EdgeRefusals`, the key broker's
too), with the tenant when a key or principal named one."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from policy.audit.edge import EdgeRefusals


def audit_edge(scope: Mapping[str, Any], status: int, code: str | None) -> None:
    """Audit an answer made at the edge, through the app's service (when it has an EdgeRefusals). The
    answer goes out even if the audit log refuses the write (a tampered log stops the gateway's
    decisions, not its error replies); that failure is logged."""
    app = scope.get("app")
    edge = getattr(getattr(getattr(app, "state", None), "service", None), "edge_audit", None)
    if not isinstance(edge, EdgeRefusals):
        return
    state = scope.get("state") or {}
    edge.refused(scope, status, code, tenant=state.get("audit_tenant"))  # logs, never raises, a failed write
