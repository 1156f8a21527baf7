"""Admission of one request: token budgets (tenant and key), then the rate limits and queue bound
of the AdmissionController; every refusal is counted and audited."""

from __future__ import annotations

from api.gateway.admission import AdmissionController, Ticket
from api.gateway.catalog import Catalog
from api.gateway.errors import GatewayError
from api.gateway.metrics import Metrics
from api.gateway.settings import GatewaySettings
from api.store.repo import KeyRecord
from policy.audit import AuditLog


class Admission:
    def __init__(self, settings: GatewaySettings, catalog: Catalog, controller: AdmissionController,
                 metrics: Metrics, audit: AuditLog) -> None:
        self.settings, self.catalog, self.controller = settings, catalog, controller
        self.metrics, self.audit = metrics, audit

    def audit_refusal(self, key: KeyRecord, kind: str, exc: GatewayError) -> None:
        """An admission refusal (rate, tokens per minute, budget, queue) in the audit trail."""
        self.audit.append(tenant=key.tenant, action="admission", decision="deny", reason=f"{kind}: {exc.code}",
                          metadata={"key_id": key.key_id, "status": exc.status, "limit": kind})

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
                        key_tpm=key.tpm, max_queued=(t.max_queued if t and t.max_queued else
                                                     self.settings.max_queued), streams=streams)
        try:
            self.controller.check_limits(ticket)
        except GatewayError as exc:
            self.metrics.rejected.labels(key.tenant, "rate").inc()
            self.audit_refusal(key, "rate", exc)
            raise
        return ticket
