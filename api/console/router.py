"""The console's routes under /console: login, audit, workers, keys, usage, policies, exports.

``install(app, settings)`` adds them to the gateway app next to the management API; they use the
same tokens and roles (operator, tenant admin, auditor) through a browser session cookie.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Depends, FastAPI, Form, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response, StreamingResponse
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates

from api.console import exports
from api.console.auditindex import AuditIndex, load_component_keys
from api.console.broker import BrokerUnavailable, BrokerView
from api.console.broker_token import broker_token, delete_broker_cookie, set_broker_cookie
from api.console.charts import bar_chart
from api.console.session import (
    COOKIE,
    ConsoleAuthError,
    ConsoleForbidden,
    Viewer,
    check_csrf,
    cookie_secure,
    exchange,
    same_origin,
    set_session_cookie,
    viewer,
)
from api.console.sso import end_session_url
from api.console.sso import router as sso_router
from api.console.state import Console, ConsoleState, bind_console
from api.console.views import (
    AuditFilter,
    Facets,
    bucket_usage,
    chain_status,
    policy_diff,
    policy_signature,
    scoped_filter,
    select_rows,
    worker_rows,
)
from api.console_settings import ConsoleSettings
from api.gateway.dependencies import get_service
from api.gateway.service import GatewayService
from api.management.oidc import OidcVerifier, get_oidc_verifier
from policy.audit import CheckpointAnchor, SqlAnchor, WitnessFile

log = logging.getLogger(__name__)
HERE = Path(__file__).parent
READ_ROLES = ("operator", "tenant-admin", "auditor")
REVOKE_ROLES = ("operator", "tenant-admin")  # the auditor is read-only
EXPORT_MEDIA = {"jsonl": "application/x-ndjson", "csv": "text/csv", "ocsf": "application/x-ndjson"}


def _render(state: ConsoleState, request: Request, name: str, who: Viewer | None, **ctx: Any) -> HTMLResponse:
    started = getattr(request.state, "console_started", None)
    return state.templates.TemplateResponse(request, name, {
        "who": who, "nav": name.removesuffix(".html"), "started": started, "perf_counter": time.perf_counter,
        **ctx})


def _tenants(service: GatewayService, who: Viewer) -> list[str]:
    if who.tenant is not None:
        return [who.tenant]
    return [t.name for t in service.store.tenants()]


def _pick_tenant(service: GatewayService, who: Viewer, tenant: str | None) -> str | None:
    choices = _tenants(service, who)
    if who.tenant is not None:
        return who.tenant  # never another tenant's, whatever the query says
    if tenant and tenant in choices:
        return tenant
    return choices[0] if choices else None


router = APIRouter(prefix="/console", include_in_schema=False)


@router.get("/login", response_class=HTMLResponse)
def login_form(request: Request, console: Console, error: str | None = None) -> HTMLResponse:
    return _render(console, request, "login.html", None, error=error)


@router.post("/login", dependencies=[Depends(same_origin)])
def login(request: Request, state: Console, token: str = Form("", max_length=4096),
          service: GatewayService = Depends(get_service)) -> Response:
    secret = service.settings.jwt_secret
    if not state.templates.env.globals.get("local_auth"):
        raise ConsoleForbidden("sign in with single sign-on; local management tokens are not accepted here")
    try:
        session = exchange(secret, token, state.settings.session_ttl_s, service.store.revocations)
    except (ConsoleAuthError, ConsoleForbidden) as exc:
        # The same form again, with the reason; the token is never echoed back.
        response = _render(state, request, "login.html", None, error=str(exc))
        response.status_code = 401 if isinstance(exc, ConsoleAuthError) else 403
        return response
    redirect = RedirectResponse("/console/audit", status_code=303)
    set_session_cookie(redirect, session, secure=cookie_secure(request, state.settings.unsafe_plain_http_loopback),
                       max_age=state.settings.session_ttl_s)
    return redirect


@router.post("/logout", dependencies=[Depends(same_origin)])
def logout(request: Request, csrf: str = Form(""), who: Viewer = Depends(viewer),
           service: GatewayService = Depends(get_service),
           oidc: OidcVerifier | None = Depends(get_oidc_verifier)) -> Response:
    check_csrf(request, csrf, who)
    service.store.revocations.end_session(who.principal.token_id)  # ends it for every replica
    # With single sign-on the IdP's session ends too (RP-initiated logout), where it supports that.
    response = RedirectResponse(end_session_url(oidc) or "/console/login", status_code=303)
    response.delete_cookie(COOKIE, path="/console")
    delete_broker_cookie(response)  # the person's own broker token goes with the session
    return response


@router.get("")
@router.get("/")
def home() -> RedirectResponse:
    return RedirectResponse("/console/audit", status_code=303)


def _audit_query(who: Viewer, tenant: str | None, component: str | None, rule: str | None,
                 decision: str | None, since: str | None, until: str | None) -> tuple[AuditFilter, str | None]:
    try:
        return scoped_filter(who, tenant=tenant, component=component, rule=rule, decision=decision, since=since,
                             until=until), None
    except ValueError as exc:
        return scoped_filter(who, tenant=tenant, component=component, rule=rule, decision=decision, since=None,
                             until=None), str(exc)


async def _index(state: ConsoleState) -> AuditIndex | None:
    index = state.index
    if index is not None:
        await asyncio.to_thread(index.refresh)
    return index


@router.get("/audit", response_class=HTMLResponse)
async def audit_page(request: Request, state: Console, who: Viewer = Depends(viewer), tenant: str | None = None,
                     component: str | None = None, rule: str | None = None, decision: str | None = None,
                     since: str | None = None, until: str | None = None,
                     page: int = Query(1, ge=1, le=1_000_000)) -> HTMLResponse:
    index = await _index(state)
    flt, error = _audit_query(who, tenant, component, rule, decision, since, until)
    size = state.settings.page_size
    if index is None:
        return _render(state, request, "audit.html", who, configured=False, flt=flt, error=error)
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
    return _render(state, request, "audit.html", who, configured=True, rows=shown, total=len(rows), page=page,
                   pages=pages, flt=flt, error=error, statuses=statuses, breaks=breaks, after=after,
                   tenants=tenants, components=components, rules=rules, query=query, since=since or "",
                   until=until or "")


@router.get("/audit/export.{fmt}")
async def audit_export(request: Request, fmt: str, state: Console, who: Viewer = Depends(viewer),
                       tenant: str | None = None, component: str | None = None, rule: str | None = None,
                       decision: str | None = None, since: str | None = None, until: str | None = None) -> Response:
    if fmt not in EXPORT_MEDIA:
        raise ConsoleForbidden("export formats: jsonl, csv, ocsf")
    index = await _index(state)
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


async def _reference_values(broker: BrokerView, request: Request, tenants: set[str]
                            ) -> dict[tuple[str, str], set[str]]:
    out: dict[tuple[str, str], set[str]] = {}
    if not broker.configured:
        return out
    token = broker_token(request)
    if token is None:
        return out
    for tenant in tenants:
        try:
            policies = await asyncio.to_thread(broker.release_policies, tenant, token)
        except BrokerUnavailable:
            continue
        for p in policies:
            out.setdefault((tenant, str(p.get("model"))), set()).update(p.get("allowed_measurements") or ())
    return out


@router.get("/workers", response_class=HTMLResponse)
async def workers_page(request: Request, state: Console, who: Viewer = Depends(viewer),
                       service: GatewayService = Depends(get_service)) -> HTMLResponse:
    reg = service.registry
    # What each worker submitted in its signed heartbeats (nothing is fetched from a worker's address).
    attestations = [a for a in await service.enrolment.attestation_all() if who.sees(str(a.get("tenant")))]
    tenants = {w.tenant for w in reg.workers.values() if who.sees(w.tenant)}
    reference = await _reference_values(state.broker, request, tenants)
    rows = worker_rows(service, attestations, reference, who, time.time())
    return _render(state, request, "workers.html", who, rows=rows, now=dt.datetime.now(dt.UTC),
                   broker=state.broker.configured)


def _pinned_receipt_key(state: ConsoleState):  # type: ignore[no-untyped-def]
    # The broker signs receipts with its audit key, which the console already pins for the log.
    return load_component_keys(state.settings.keys_dir).get("key-broker")


@router.get("/keys", response_class=HTMLResponse)
async def keys_page(request: Request, state: Console, who: Viewer = Depends(viewer), tenant: str | None = None,
                    done: str | None = None, service: GatewayService = Depends(get_service)
                    ) -> HTMLResponse:
    chosen = _pick_tenant(service, who, tenant)
    status, receipts, error = None, [], None
    if chosen is not None:
        try:
            token = broker_token(request)
            status = await asyncio.to_thread(state.broker.tenant_status, chosen, token)
            receipts = await asyncio.to_thread(state.broker.receipts, chosen, token, _pinned_receipt_key(state))
        except BrokerUnavailable as exc:
            error = str(exc)
    receipts = sorted(receipts, key=lambda r: str(r.get("time", "")), reverse=True)[:200]
    history = []
    index = await _index(state)
    if index is not None and chosen is not None:
        history = [r for r in reversed(index.by_tenant.get(chosen, ()))
                   if any(w in r.entry.action for w in ("revoke", "rotate", "tenant-key"))][:50]
    versions = [v for v in service.store.model_versions(chosen)] if chosen else []
    ready = {(w.model, w.version) for w in service.registry.workers.values()
             if w.tenant == chosen and service.registry.alive(w) and w.status == "ready"}
    data_keys = {(d["model"], d["version"]): d for d in (status or {}).get("data_keys", [])}
    revoked = bool((status or {}).get("revoked"))
    servable = [{"model": v.model, "version": v.version, "traffic": v.traffic_percent,
                 "data_key": data_keys.get((v.model, v.version)),
                 "serving": (v.model, v.version) in ready,
                 "servable": not revoked and (v.model, v.version) in data_keys} for v in versions]
    return _render(state, request, "keys.html", who, tenant=chosen, tenants=_tenants(service, who), status=status,
                   receipts=receipts, error=error, history=history, servable=servable, done=done,
                   can_revoke=who.role in REVOKE_ROLES and status is not None and not revoked,
                   broker=state.broker.configured, connected=broker_token(request) is not None)


@router.post("/keys/broker", dependencies=[Depends(same_origin)])
def connect_broker(request: Request, state: Console, token: str = Form("", max_length=4096), csrf: str = Form(""),
                   disconnect: str = Form(""), who: Viewer = Depends(viewer)) -> Response:
    """Keep the person's own broker token in this browser (api/console/broker_token.py); the console
    stores nothing. ``disconnect`` forgets it."""
    check_csrf(request, csrf, who)
    response = RedirectResponse("/console/keys", status_code=303)
    if disconnect:
        delete_broker_cookie(response)
        return response
    token = token.strip()
    if not token or len(token) > 256 or not token.isascii() or not token.isprintable():
        raise ConsoleForbidden("give your key-broker tenant-admin token")
    set_broker_cookie(response, token, secure=cookie_secure(request, state.settings.unsafe_plain_http_loopback),
                      max_age=state.settings.session_ttl_s)
    return response


@router.get("/keys/revoke", response_class=HTMLResponse)
def revoke_confirm(request: Request, tenant: str, state: Console, who: Viewer = Depends(viewer)) -> HTMLResponse:
    if who.role not in REVOKE_ROLES:
        raise ConsoleForbidden("the auditor role is read-only")
    if not who.sees(tenant):
        raise ConsoleForbidden("no such tenant")
    return _render(state, request, "revoke.html", who, tenant=tenant, error=None)


@router.post("/keys/revoke", dependencies=[Depends(same_origin)])
async def revoke(request: Request, state: Console, tenant: str = Form(..., max_length=64), confirm: str = Form(""),
                 csrf: str = Form(""), who: Viewer = Depends(viewer)) -> Response:
    check_csrf(request, csrf, who)
    if who.role not in REVOKE_ROLES:
        raise ConsoleForbidden("the auditor role is read-only")
    if not who.sees(tenant):
        raise ConsoleForbidden("no such tenant")
    if confirm != tenant:
        response = _render(state, request, "revoke.html", who, tenant=tenant,
                           error="type the tenant's name exactly to confirm")
        response.status_code = 400
        return response
    try:
        await asyncio.to_thread(state.broker.revoke, tenant, broker_token(request))
    except BrokerUnavailable as exc:
        _record(state, who, tenant, "deny", str(exc))
        response = _render(state, request, "revoke.html", who, tenant=tenant, error=f"not revoked: {exc}")
        response.status_code = 502
        return response
    _record(state, who, tenant, "allow", "revoked from the console")
    return RedirectResponse(f"/console/keys?tenant={tenant}&done=revoked", status_code=303)


def _record(state: ConsoleState, who: Viewer, tenant: str, decision: str, reason: str) -> None:
    """Audit a console action with the person who did it (the broker's own entry names the broker
    token the person gave, not who they are): in the console's signed log, and in the process log."""
    meta = {"actor": who.principal.subject[:128], "role": who.role, "via": "console"}
    log.warning("console: %s (%s) revoke tenant key of %s: %s", who.principal.subject, who.role, tenant, decision)
    audit = state.audit_log()
    if audit is not None:
        audit.append(tenant=tenant, action="tenant-key-revoke", decision=decision, reason=reason, metadata=meta)
        audit.flush()


@router.get("/usage", response_class=HTMLResponse)
async def usage_page(request: Request, state: Console, who: Viewer = Depends(viewer), tenant: str | None = None,
                     hours: int = Query(24, ge=1, le=24 * 90),
                     service: GatewayService = Depends(get_service)) -> HTMLResponse:
    until = dt.datetime.now(dt.UTC)
    since = until - dt.timedelta(hours=hours)
    scope = who.tenant or (tenant or None)
    rows = await asyncio.to_thread(service.store.usage_rows, scope, since)
    agg = bucket_usage(rows, since, until)
    charts = []
    budgets = {t.name: t.token_budget for t in service.store.tenants()}
    for name in sorted(agg["tenants"]):
        if not who.sees(name):
            continue
        series = agg["tenants"][name]
        used = service.store.tokens_used(name)
        charts.append({"tenant": name, "used": used, "budget": budgets.get(name), "svgs": [
            bar_chart(list(zip(agg["labels"], series["tokens"], strict=True)), title=f"{name}: tokens",
                      budget=budgets.get(name), cumulative=True),
            bar_chart(list(zip(agg["labels"], series["requests"], strict=True)), title=f"{name}: requests"),
            bar_chart(list(zip(agg["labels"], series["worker_seconds"], strict=True)),
                      title=f"{name}: worker-seconds", unit="s")]})
    keys = {}
    for t in {k[0] for k in agg["by_key"]}:
        keys.update({(t, k.key_id): k for k in service.store.keys(t)})
    def spark(series: list[float], title: str, budget: float | None = None) -> Any:
        return bar_chart(list(zip(agg["labels"], series, strict=True)), title=title, budget=budget,
                         cumulative=budget is not None, width=300, height=90)

    by_key = [(t, k, v, keys.get((t, k)),
               spark(agg["key_series"][(t, k)], f"{k}: tokens",
                     keys[(t, k)].token_budget if (t, k) in keys else None))
              for (t, k), v in sorted(agg["by_key"].items()) if who.sees(t)]
    by_model = [(t, m, v, spark(agg["model_series"][(t, m)], f"{m}: tokens"))
                for (t, m), v in sorted(agg["by_model"].items()) if who.sees(t)]
    return _render(state, request, "usage.html", who, charts=charts, by_key=by_key, by_model=by_model, hours=hours,
                   tenant=scope, tenants=_tenants(service, who), since=since, until=until)


@router.get("/policies", response_class=HTMLResponse)
def policies_page(request: Request, state: Console, who: Viewer = Depends(viewer), tenant: str | None = None,
                  a: int | None = None, b: int | None = None,
                  service: GatewayService = Depends(get_service)) -> HTMLResponse:
    chosen = _pick_tenant(service, who, tenant)
    versions = service.store.policy_versions(chosen) if chosen else []
    rows = [{"version": v.version, "created_at": v.created_at,
             **policy_signature(chosen or "", v.document, state.settings.policy_keys_dir)} for v in versions]
    by_version = {v.version: v.document for v in versions}
    diff, pair = None, None
    if len(versions) >= 2:
        new = b if b is not None and b in by_version else versions[0].version
        old = a if a is not None and a in by_version else versions[1].version
        diff, pair = policy_diff(by_version[old], by_version[new], old, new), (old, new)
    return _render(state, request, "policies.html", who, tenant=chosen, tenants=_tenants(service, who), rows=rows,
                   diff=diff, pair=pair)


def install(app: FastAPI, settings: ConsoleSettings, data_dir: Path, *, sso: bool = False,
            local_auth: bool = True) -> None:
    """Serve the console from ``app`` (the gateway with its management API); ``data_dir`` keeps
    the console's audit signing key. ``sso``: sign-in through the IdP (api/console/sso.py);
    ``local_auth``: the pasted local management token (the development mode, or SSO's opt-in)."""
    templates = Jinja2Templates(directory=str(HERE / "templates"))
    templates.env.autoescape = True
    templates.env.globals.update(sso=sso, local_auth=local_auth, dev_auth=local_auth and not sso)
    anchors: list[CheckpointAnchor] = []
    if settings.audit_witness is not None:
        anchors.append(WitnessFile(settings.audit_witness))
    if settings.audit_anchor_url:
        anchors.append(SqlAnchor(settings.audit_anchor_url))
    index = (AuditIndex(settings.audit_dir, settings.keys_dir, anchors) if settings.audit_dir is not None
             else None)
    state = ConsoleState(settings, index, Facets(), BrokerView(settings.broker_url), templates,
                         audit_key_file=data_dir / "console-audit.pem")
    bind_console(app, state)
    app.include_router(router)
    app.include_router(sso_router)
    app.mount("/console/static", StaticFiles(directory=str(HERE / "static")), name="console-static")

    async def auth_error(request: Request, _: Exception) -> Response:
        return RedirectResponse("/console/login", status_code=303)

    async def forbidden(request: Request, exc: Exception) -> Response:
        response = _render(state, request, "error.html", None, message=str(exc))
        response.status_code = 403
        return response

    app.add_exception_handler(ConsoleAuthError, auth_error)
    app.add_exception_handler(ConsoleForbidden, forbidden)

    app.add_middleware(ConsoleHeaders)


_HEADERS = [
    # No inline script or style, nothing from elsewhere, never framed, never cached.
    (b"content-security-policy", b"default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; "
                                 b"frame-ancestors 'none'; base-uri 'none'"),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    # same-origin, not no-referrer: with no-referrer Chromium sends "Origin: null" on form posts.
    (b"referrer-policy", b"same-origin"),
    (b"cache-control", b"no-store"),
]


class ConsoleHeaders:
    """Security headers on /console responses; a plain ASGI layer, so the API's streams pass untouched."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or not scope["path"].startswith("/console"):
            await self.app(scope, receive, send)
            return
        scope.setdefault("state", {})["console_started"] = time.perf_counter()

        async def with_headers(message: Any) -> None:
            if message["type"] == "http.response.start":
                names = {name for name, _ in _HEADERS}
                message["headers"] = [h for h in message.get("headers", []) if h[0] not in names] + _HEADERS
            await send(message)
        await self.app(scope, receive, with_headers)
