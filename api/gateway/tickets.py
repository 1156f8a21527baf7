"""Admission of one request: token budgets (tenant and key), then the rate limits and queue bound
of the AdmissionController; every refusal is counted and audited.

Refusals are audited in aggregate (policy/audit/aggregate.py), because the tenant chooses how many
there are: the first of each kind (tenant, key, limit, status, code) in a 60 s window is an
`admission` entry; the rest of that kind are counted in one `admission-summary` entry per kind
when the window closes (or the gateway stops). A flood costs one write per kind and window, and
`admission` entries + summary counts = refusals answered.
"""

from __future__ import annotations

from api.gateway.admission import AdmissionController, Ticket
from api.gateway.catalog import Catalog
from api.gateway.errors import GatewayError
from api.gateway.metrics import Metrics
from api.gateway.settings import GatewaySettings
from api.store.models import Tenant
from api.store.repo import KeyRecord
from policy.audit import AuditLog
from policy.audit.aggregate import Kind, WindowedRefusals


class Admission:
    def __init__(self, settings: GatewaySettings, catalog: Catalog, controller: AdmissionController,
                 metrics: Metrics, audit: AuditLog) -> None:
        self.settings, self.catalog, self.controller = settings, catalog, controller
        self.metrics, self.audit = metrics, audit
        self.refusals = WindowedRefusals(self._summary, self._overflow)

    def audit_refusal(self, key: KeyRecord, kind: str, exc: GatewayError) -> None:
        """An admission refusal (rate, tokens per minute, budget, queue) in the audit trail: the first
        of its kind in the window in full, the others counted in the window's summary."""
        refusal = (key.tenant, key.key_id, kind, exc.status, exc.code or "")

        def first() -> None:
            self.audit.append(tenant=key.tenant, action="admission", decision="deny", reason=f"{kind}: {exc.code}",
                              metadata={"key_id": key.key_id, "status": exc.status, "limit": kind,
                                        "aggregated_window_s": self.refusals.window_s})

        self.refusals.refused(refusal, first)

    def _summary(self, refusal: Kind, count: int, window_s: float) -> None:
        tenant, key_id, kind, status, code = (str(v) for v in refusal)  # as audit_refusal built it
        self.audit.append(tenant=tenant, action="admission-summary", decision="deny",
                          reason=f"{kind}: {code}: {count} more in the window",
                          metadata={"key_id": key_id, "status": int(status), "limit": kind, "code": code,
                                    "count": count, "window_s": window_s})

    def _overflow(self, count: int, window_s: float) -> None:
        self.audit.append(tenant="-", action="admission-summary", decision="deny",
                          reason=f"{count} admission refusals of kinds beyond the first {self.refusals.max_kinds}",
                          metadata={"count": count, "overflow": True, "window_s": window_s})

    def early_refusal(self, key: KeyRecord) -> GatewayError | None:
        """Before the request's body is read (admission_gate.py): the 429 its key's own request rate
        or its tenant's queue bound would get now, counted and audited like the same refusal later;
        None: read on. Peeks only, so nothing is charged twice."""
        t = self.catalog.tenant(key.tenant)
        exc = self.controller.own_limit_refusal(key.tenant, key.key_id, t.rpm if t else None, key.rpm,
                                                self._max_queued(t))
        if exc is not None:
            queue = exc.code == "queue_full"
            if not queue:
                self.metrics.rejected.labels(key.tenant, "rate").inc()
            self.audit_refusal(key, "queue" if queue else "rate", exc)
        return exc

    def _max_queued(self, t: Tenant | None) -> int:
        return t.max_queued if t and t.max_queued else self.settings.max_queued

    def ticket(self, key: KeyRecord, reserved_tokens: int, priority: int | None = None, streams: int = 1) -> Ticket:
        t = self.catalog.tenant(key.tenant)
        for budget, key_id in ((t.token_budget if t else None, None), (key.token_budget, key.key_id)):
            if budget is None:
                continue
            if reserved_tokens > budget:  # can never fit: refused (and audited) like any other admission refusal
                too_large = GatewayError(400, f"Request too large: it may use up to {reserved_tokens} tokens, more "
                                         f"than the whole token budget of {budget}"
                                         + (" of this key." if key_id else "."), code="request_too_large")
                self.audit_refusal(key, "key-budget" if key_id else "tenant-budget", too_large)
                raise too_large
            if self.catalog.tokens_used(key.tenant, key_id) >= budget:
                self.metrics.rejected.labels(key.tenant, "budget").inc()
                error = GatewayError(429, "You exceeded your token budget" + (" for this key." if key_id else "."),
                                     type_="insufficient_quota", code="insufficient_quota")
                self.audit_refusal(key, "key-budget" if key_id else "tenant-budget", error)
                raise error
        ticket = Ticket(tenant=key.tenant, key_id=key.key_id, weight=t.weight if t else 1.0,
                        # A request may lower its priority, never raise it above its key's.
                        priority=key.priority if priority is None else min(priority, key.priority),
                        reserved_tokens=reserved_tokens,
                        tenant_rpm=t.rpm if t else None, key_rpm=key.rpm, tenant_tpm=t.tpm if t else None,
                        key_tpm=key.tpm, max_queued=self._max_queued(t), streams=streams)
        try:
            self.controller.check_limits(ticket)
        except GatewayError as exc:
            self.metrics.rejected.labels(key.tenant, "rate").inc()
            self.audit_refusal(key, "rate", exc)
            raise
        return ticket
