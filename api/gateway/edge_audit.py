"""The gateway's hook for refusals answered at its edge (401, 403, 404, 405, 413 and schema errors):
which answers are audited here, and the call into the shared, flood-proof aggregate audit
(`policy.audit.edge.EdgeRefusals`, the key broker's too). Admission refusals (429,
request_too_large) and the worker's signed refusals are audited where they are decided.
"""

from __future__ import annotations

from typing import Any

from policy.audit.edge import EdgeRefusals

# Answers audited here; others are audited where they are decided (admission refusals: 429 and
# request_too_large; the worker's signed refusals: content_policy_violation).
STATUSES = frozenset({400, 401, 403, 404, 405, 413, 422})
DECIDED_ELSEWHERE = frozenset({"content_policy_violation", "request_too_large", "insufficient_quota",
                               "rate_limit_exceeded", "queue_full"})


def audit_edge(scope: dict[str, Any], status: int, code: str | None) -> None:
    """Audit an answer made at the edge, through the app's service (when it has an EdgeRefusals). The
    answer goes out even if the audit log refuses the write (a tampered log stops the gateway's
    decisions, not its error replies); that failure is logged."""
    app = scope.get("app")
    edge = getattr(getattr(getattr(app, "state", None), "service", None), "edge_audit", None)
    if not isinstance(edge, EdgeRefusals) or status not in STATUSES or (code or "") in DECIDED_ELSEWHERE:
        return
    state = scope.get("state") or {}
    edge.refused(scope, status, code, tenant=state.get("audit_tenant"))  # logs, never raises, a failed write
