"""The audit page (the signed logs' entries a person may see, and whether each chain holds) and its
exports (JSON lines, CSV, OCSF)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import HTMLResponse, Response, StreamingResponse

from api.console import exports
from api.console.pages.render import refreshed_index, render
from api.console.session import ConsoleForbidden, Viewer, viewer
from api.console.state import Console
from api.console.views import AuditFilter, chain_status, scoped_filter, select_rows

router = APIRouter(prefix="/console", include_in_schema=False)
EXPORT_MEDIA = {"jsonl": "application/x-ndjson", "csv": "text/csv", "ocsf": "application/x-ndjson"}


def _audit_query(who: Viewer, tenant: str | None, component: str | None, rule: str | None,
                 decision: str | None, since: str | None, until: str | None) -> tuple[AuditFilter, str | None]:
    try:
        return scoped_filter(who, tenant=tenant, component=component, rule=rule, decision=decision, since=since,
                             until=until), None
    except ValueError as exc:
        return scoped_filter(who, tenant=tenant, component=component, rule=rule, decision=decision, since=None,
                             until=None), str(exc)


@router.get("/audit", response_class=HTMLResponse)
async def audit_page(request: Request, state: Console, who: Viewer = Depends(viewer), tenant: str | None = None,
                     component: str | None = None, rule: str | None = None, decision: str | None = None,
                     since: str | None = None, until: str | None = None,
                     page: int = Query(1, ge=1, le=1_000_000)) -> HTMLResponse:
    index = await refreshed_index(state)
    flt, error = _audit_query(who, tenant, component, rule, decision, since, until)
    size = state.settings.page_size
    if index is None:
        return render(state, request, "audit.html", who, configured=False, flt=flt, error=error)
    rows = select_rows(index, flt)
    pages = max(1, (len(rows) + size - 1) // size)
    page = min(page, pages)
    shown = rows[(page - 1) * size: page * size]
    statuses = chain_status(index, size)
    breaks = {(s["broken"].log, s["broken"].index): s["broken"] for s in statuses if s["broken"]}
    after = {s["broken"].log: s["broken"].index for s in statuses if s["broken"]}
    tenants, components, rules = state.facets.get(index, who)
    # A tenant admin sees whether the chain holds, not other tenants' entries: the break is
    # described by position and reason only (both are about the log, not a tenant's data).
    query = {k: v for k, v in {"tenant": flt.tenant if who.tenant is None else None, "component": flt.component,
                               "rule": flt.rule, "decision": flt.decision, "since": since, "until": until}.items()
             if v}
    return render(state, request, "audit.html", who, configured=True, rows=shown, total=len(rows), page=page,
                  pages=pages, flt=flt, error=error, statuses=statuses, breaks=breaks, after=after,
                  tenants=tenants, components=components, rules=rules, query=query, since=since or "",
                  until=until or "")


@router.get("/audit/export.{fmt}")
async def audit_export(request: Request, fmt: str, state: Console, who: Viewer = Depends(viewer),
                       tenant: str | None = None, component: str | None = None, rule: str | None = None,
                       decision: str | None = None, since: str | None = None, until: str | None = None) -> Response:
    if fmt not in EXPORT_MEDIA:
        raise ConsoleForbidden("export formats: jsonl, csv, ocsf")
    index = await refreshed_index(state)
    flt, error = _audit_query(who, tenant, component, rule, decision, since, until)
    if error:
        raise ConsoleForbidden(error)
    rows = [] if index is None else select_rows(index, flt)
    entries = (rows[i].entry for i in range(len(rows) - 1, -1, -1))  # exports run oldest first
    body: Iterator[str] = {"jsonl": exports.jsonl_lines, "csv": exports.csv_chunks,
                           "ocsf": exports.ocsf_lines}[fmt](entries)
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    name = f"sealed-audit-{who.tenant or 'all'}-{stamp}.{'ocsf.jsonl' if fmt == 'ocsf' else fmt}"
    return StreamingResponse(body, media_type=EXPORT_MEDIA[fmt],
                             headers={"Content-Disposition": f'attachment; filename="{name}"'})
