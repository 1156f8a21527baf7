"""Refusals at a service's HTTP edge in the audit trail, flood-proof: the gateway's and the key
broker's 401, 403, 404, 405, 413 and schema errors.

These answers are made before any tenant's decision (an unknown key, a route that does not exist,
a body that does not parse), often to an attacker, who controls how many there are. So they are
audited in aggregate: the first refusal of each *kind* (status, code, route template, method,
tenant, source address) in a window (`window_s`, 60 s) is appended in full; further ones of that
kind in the window are only counted, and when the window closes (or the service stops, `flush`)
one `edge-refusal-summary` entry per kind carries the count. Kinds are bounded too (`max_kinds` per
window); refusals beyond are counted in one overflow summary. A flood of any size therefore costs
at most 2 x `max_kinds` + 1 entries per window, and every refusal is in a count (the window is
aggregate.py's).

Nothing of the request's content is logged: the route template (or the bounded raw path for an
unknown route), the method, the peer address, the status and error code, and for a bearer
credential that was refused a 48-bit fingerprint of its SHA-256 (enough to tell one guessed key
from many). The caller's answer goes out either way: an audit write that fails is logged, never
raised (an error reply must not become a 500).
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from policy.audit.aggregate import Kind, WindowedRefusals
from policy.audit.log import AuditLog

log = logging.getLogger(__name__)

# Answers audited here; others are audited where they are decided (the gateway's admission
# refusals: 429 and request_too_large; the worker's signed refusals: content_policy_violation).
STATUSES = frozenset({400, 401, 403, 404, 405, 413, 422})
DECIDED_ELSEWHERE = frozenset({"content_policy_violation", "request_too_large", "insufficient_quota",
                               "rate_limit_exceeded", "queue_full"})


def route_of(scope: Mapping[str, Any]) -> str:
    """The matched route's template (never its parameters' values), else the bounded raw path."""
    route, path = scope.get("route"), str(scope.get("path", ""))
    template = getattr(route, "path_format", None) or getattr(route, "path", None)
    if isinstance(template, str):
        # An included router's template lacks its (static) prefix: take that from the raw path.
        extra = path.count("/") - template.count("/")
        prefix = "/".join(path.split("/")[:extra + 1]) if extra > 0 else ""
        return (prefix + template)[:128]
    return "unmatched:" + path[:96]


def fingerprint(scope: Mapping[str, Any]) -> str:
    """48 bits of the SHA-256 of the request's bearer credential; empty without one."""
    for name, value in scope.get("headers") or ():
        if name == b"authorization":
            secret = value.partition(b" ")[2].strip()
            return hashlib.sha256(secret).hexdigest()[:12] if secret else ""
    return ""


class EdgeRefusals:
    def __init__(self, audit: AuditLog, window_s: float = 60.0, max_kinds: int = 256,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.audit = audit
        self.window = WindowedRefusals(self._summary, self._overflow, window_s=window_s, max_kinds=max_kinds,
                                       clock=clock)

    def refused(self, scope: Mapping[str, Any], status: int, code: str | None, tenant: str | None = None) -> None:
        """One refusal answered at the edge (called where the answer is made); never raises."""
        if status not in STATUSES or (code or "") in DECIDED_ELSEWHERE:
            return
        client = scope.get("client") or ("", 0)
        route, method, source = route_of(scope), str(scope.get("method", ""))[:8], str(client[0])[:64]
        who = tenant or "-"
        kind: Kind = (status, code or "", route, method, who, source)

        def first() -> None:
            self.audit.append(tenant=who, action="edge-refusal", decision="deny", reason=f"{status} {code or ''}",
                              metadata={"status": status, "code": code or "", "route": route, "method": method,
                                        "source": source, "key_fp": fingerprint(scope),
                                        "aggregated_window_s": self.window.window_s})

        try:
            self.window.refused(kind, first)
        except Exception as exc:  # a refusal's answer must not become a 500
            log.error("edge refusal not audited: %s", type(exc).__name__)

    def flush(self) -> None:
        """Write the summaries of the window (at its end, and when the service stops)."""
        self.window.flush()

    def _summary(self, kind: Kind, count: int, window_s: float) -> None:
        status, code, route, method, tenant, source = (str(v) for v in kind)
        self.audit.append(tenant=tenant, action="edge-refusal-summary", decision="deny",
                          reason=f"{status} {code}: {count} more in the window",
                          metadata={"status": int(status), "code": code, "route": route, "method": method,
                                    "source": source, "count": count, "window_s": window_s})

    def _overflow(self, count: int, window_s: float) -> None:
        self.audit.append(tenant="-", action="edge-refusal-summary", decision="deny",
                          reason=f"{count} refusals of kinds beyond the first {self.window.max_kinds}",
                          metadata={"count": count, "overflow": True, "window_s": window_s})
