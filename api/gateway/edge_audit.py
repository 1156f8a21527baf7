"""Refusals at the edge in the audit trail, flood-proof: 401, 403, 404, 405, 413 and schema errors.

These answers are made before any tenant's decision (an unknown key, a model the key cannot see,
a body that does not parse), often to an attacker, who controls how many there are. So they are
audited in aggregate: the first refusal of each *kind* (status, code, route, method, tenant,
source address) in a window (`window_s`, 60 s) is appended in full; further ones of that kind in
the window are only counted, and when the window closes one `edge-refusal-summary` entry per kind
carries the count. Kinds are bounded too (`max_kinds` per window); refusals beyond are counted in
one overflow summary. A flood of any size therefore costs at most 2 x `max_kinds` + 1 entries per
window, and every refusal is in a count. Nothing of the request's content is logged: the route
template (or the bounded raw path for an unknown route), the method, the peer address, the status
and error code, and for a bearer credential that was refused a 48-bit fingerprint of its SHA-256
(enough to tell one guessed key from many; the audit layer bounds and escapes every value). The
window and the counting are policy/audit/aggregate.py's, shared with the admission refusals
(tickets.py) and the key broker's schema refusals.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable
from typing import Any

from policy.audit import AuditLog
from policy.audit.aggregate import WindowedRefusals

log = logging.getLogger(__name__)

# Answers audited here; others are audited where they are decided (admission refusals: 429 and
# request_too_large; the worker's signed refusals: content_policy_violation).
STATUSES = frozenset({400, 401, 403, 404, 405, 413, 422})
DECIDED_ELSEWHERE = frozenset({"content_policy_violation", "request_too_large", "insufficient_quota",
                               "rate_limit_exceeded", "queue_full"})


def route_of(scope: dict[str, Any]) -> str:
    """The matched route's template (never its parameters' values), else the bounded raw path."""
    route, path = scope.get("route"), str(scope.get("path", ""))
    template = getattr(route, "path_format", None) or getattr(route, "path", None)
    if isinstance(template, str):
        # An included router's template lacks its (static) prefix: take that from the raw path.
        extra = path.count("/") - template.count("/")
        prefix = "/".join(path.split("/")[:extra + 1]) if extra > 0 else ""
        return (prefix + template)[:128]
    return "unmatched:" + path[:96]


def fingerprint(scope: dict[str, Any]) -> str:
    for name, value in scope.get("headers") or ():
        if name == b"authorization":
            secret = value.partition(b" ")[2].strip()
            return hashlib.sha256(secret).hexdigest()[:12] if secret else ""
    return ""


class EdgeAudit:
    def __init__(self, audit: AuditLog, window_s: float = 60.0, max_kinds: int = 256,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.audit = audit
        self.window = WindowedRefusals(self._summary, self._overflow, window_s=window_s, max_kinds=max_kinds,
                                       clock=clock)

    def refused(self, scope: dict[str, Any], status: int, code: str | None, tenant: str | None = None) -> None:
        """One refusal answered at the edge (called where the answer is made)."""
        if status not in STATUSES or (code or "") in DECIDED_ELSEWHERE:
            return
        client = scope.get("client") or ("", 0)
        kind = (status, code or "", route_of(scope), str(scope.get("method", ""))[:8], tenant or "-",
                str(client[0])[:64])

        def first() -> None:
            status_, code_, route, method, tenant_, source = kind
            self.audit.append(tenant=tenant_, action="edge-refusal", decision="deny", reason=f"{status_} {code_}",
                              metadata={"status": status_, "code": code_, "route": route, "method": method,
                                        "source": source, "key_fp": fingerprint(scope),
                                        "aggregated_window_s": self.window.window_s})

        self.window.refused(kind, first)

    def flush(self) -> None:
        """Write the summaries of the window (at its end, and when the gateway stops)."""
        self.window.flush()

    def _summary(self, kind: tuple[Any, ...], count: int, window_s: float) -> None:
        status, code, route, method, tenant, source = kind
        self.audit.append(tenant=tenant, action="edge-refusal-summary", decision="deny",
                          reason=f"{status} {code}: {count} more in the window",
                          metadata={"status": status, "code": code, "route": route, "method": method,
                                    "source": source, "count": count, "window_s": window_s})

    def _overflow(self, count: int, window_s: float) -> None:
        self.audit.append(tenant="-", action="edge-refusal-summary", decision="deny",
                          reason=f"{count} refusals of kinds beyond the first {self.window.max_kinds}",
                          metadata={"count": count, "overflow": True, "window_s": window_s})


def audit_edge(scope: dict[str, Any], status: int, code: str | None) -> None:
    """Audit an answer made at the edge, through the app's service (when it has an EdgeAudit). The
    answer goes out even if the audit log refuses the write (a tampered log stops the gateway's
    decisions, not its error replies); that failure is logged."""
    app = scope.get("app")
    edge = getattr(getattr(getattr(app, "state", None), "service", None), "edge_audit", None)
    if not isinstance(edge, EdgeAudit):
        return
    state = scope.get("state") or {}
    try:
        edge.refused(scope, status, code, tenant=state.get("audit_tenant"))
    except Exception as exc:  # an error reply must not become a 500
        log.error("edge refusal not audited: %s", type(exc).__name__)
