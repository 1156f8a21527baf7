"""Refusals at the key broker's edge that an attacker can multiply, audited in aggregate: schema
errors (FastAPI's 422), an unknown or refused admin token (401, 403), an unknown route or method
(404, 405) and a body over the limit (413) are answered before any release decision, so no tenant
is known and the caller chooses how many there are.

The first refusal of each kind (status, code, route template, method, peer address) in a 60 s
window is an `edge-refusal` entry (tenant `-`); the rest of that kind are counted, and one
`edge-refusal-summary` entry per kind carries the count when the window closes or the broker stops
(policy/audit/aggregate.py, as at the gateway's edge). Nothing of the request is logged: not the
body, not the fields' values, not the names of fields the caller made up. The caller still gets
the same error as before; an audit write that fails is logged and never turns it into a 500.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from policy.audit import AuditLog
from policy.audit.aggregate import Kind, WindowedRefusals

log = logging.getLogger(__name__)


def route_of(scope: Mapping[str, Any]) -> str:
    """The matched route's template (never its parameters' values), else the bounded raw path."""
    template = getattr(scope.get("route"), "path", None)
    return template[:128] if isinstance(template, str) else "unmatched:" + str(scope.get("path", ""))[:96]


class EdgeRefusals:
    def __init__(self, audit: AuditLog, window_s: float = 60.0, max_kinds: int = 256,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.audit = audit
        self.window = WindowedRefusals(self._summary, self._overflow, window_s=window_s, max_kinds=max_kinds,
                                       clock=clock)

    def refused(self, scope: Mapping[str, Any], status: int, code: str) -> None:
        """One refusal answered at the edge; never raises (the answer goes out either way)."""
        client = scope.get("client") or ("-", 0)
        kind: Kind = (status, code, route_of(scope), str(scope.get("method", ""))[:8], str(client[0])[:64])

        def first() -> None:
            self.audit.append(tenant="-", action="edge-refusal", decision="deny", reason=f"{status} {code}",
                              metadata={"status": status, "code": code, "route": str(kind[2]),
                                        "method": str(kind[3]), "source": str(kind[4]),
                                        "aggregated_window_s": self.window.window_s})

        try:
            self.window.refused(kind, first)
        except Exception as exc:  # a refusal's answer must not become a 500
            log.error("edge refusal not audited: %s", type(exc).__name__)

    def flush(self) -> None:
        self.window.flush()

    def _summary(self, kind: Kind, count: int, window_s: float) -> None:
        status, code, route, method, source = (str(v) for v in kind)
        self.audit.append(tenant="-", action="edge-refusal-summary", decision="deny",
                          reason=f"{status} {code}: {count} more in the window",
                          metadata={"status": int(status), "code": code, "route": route, "method": method,
                                    "source": source, "count": count, "window_s": window_s})

    def _overflow(self, count: int, window_s: float) -> None:
        self.audit.append(tenant="-", action="edge-refusal-summary", decision="deny",
                          reason=f"{count} refusals of kinds beyond the first {self.window.max_kinds}",
                          metadata={"count": count, "overflow": True, "window_s": window_s})
