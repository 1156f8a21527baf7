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
(enough to tell one guessed key from many; the audit layer bounds and escapes every value).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from policy.audit import AuditLog

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
        self.audit, self.window_s, self.max_kinds, self._clock = audit, window_s, max_kinds, clock
        self._lock = threading.Lock()
        self._counts: dict[tuple[Any, ...], int] = {}  # kind -> refusals counted after its first entry
        self._overflow = 0
        self._opened = 0.0
        self._timer: asyncio.TimerHandle | None = None

    def refused(self, scope: dict[str, Any], status: int, code: str | None, tenant: str | None = None) -> None:
        """One refusal answered at the edge (called where the answer is made)."""
        if status not in STATUSES or (code or "") in DECIDED_ELSEWHERE:
            return
        client = scope.get("client") or ("", 0)
        kind = (status, code or "", route_of(scope), str(scope.get("method", ""))[:8], tenant or "-",
                str(client[0])[:64])
        with self._lock:
            now = self._clock()
            if (self._counts or self._overflow) and now - self._opened >= self.window_s:
                self._flush_locked(now)
            if not self._counts and not self._overflow:
                self._opened = now
                self._arm_timer()
            if kind in self._counts:
                self._counts[kind] += 1
                return
            if len(self._counts) >= self.max_kinds:
                self._overflow += 1
                return
            self._counts[kind] = 0
            status_, code_, route, method, tenant_, source = kind
            self.audit.append(tenant=tenant_, action="edge-refusal", decision="deny", reason=f"{status_} {code_}",
                              metadata={"status": status_, "code": code_, "route": route, "method": method,
                                        "source": source, "key_fp": fingerprint(scope),
                                        "aggregated_window_s": self.window_s})

    def flush(self) -> None:
        """Write the summaries of the window (at its end, and when the gateway stops)."""
        with self._lock:
            self._flush_locked(self._clock())

    def _flush_locked(self, now: float) -> None:
        for (status, code, route, method, tenant, source), count in self._counts.items():
            if count:
                self.audit.append(tenant=tenant, action="edge-refusal-summary", decision="deny",
                                  reason=f"{status} {code}: {count} more in the window",
                                  metadata={"status": status, "code": code, "route": route, "method": method,
                                            "source": source, "count": count,
                                            "window_s": round(now - self._opened, 3)})
        if self._overflow:
            self.audit.append(tenant="-", action="edge-refusal-summary", decision="deny",
                              reason=f"{self._overflow} refusals of kinds beyond the first {self.max_kinds}",
                              metadata={"count": self._overflow, "overflow": True,
                                        "window_s": round(now - self._opened, 3)})
        self._counts, self._overflow = {}, 0
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _arm_timer(self) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # off the loop: the next refusal or close() flushes
        self._timer = loop.call_later(self.window_s, self.flush)


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
