"""The keys page: a tenant's key state at the key broker, its release receipts and key history, what
it can serve; connecting the person's own broker token; revoking a tenant's key (audited with the
person who did it)."""

from __future__ import annotations

import asyncio
import logging

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from fastapi import APIRouter, Depends, Form, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from api.console.auditindex import load_component_keys
from api.console.broker import BrokerUnavailable
from api.console.broker_token import broker_token, delete_broker_cookie, set_broker_cookie
from api.console.pages.render import pick_tenant, refreshed_index, render, tenants_of
from api.console.session import ConsoleForbidden, Viewer, check_csrf, cookie_secure, same_origin, viewer
from api.console.state import Console, ConsoleState
from api.gateway.dependencies import get_service
from api.gateway.service import GatewayService

log = logging.getLogger(__name__)
router = APIRouter(prefix="/console", include_in_schema=False)
REVOKE_ROLES = ("operator", "tenant-admin")  # the auditor is read-only


def _pinned_receipt_key(state: ConsoleState) -> Ed25519PublicKey | None:
    # The broker signs receipts with its audit key, which the console already pins for the log.
    return load_component_keys(state.settings.keys_dir).get("key-broker")


@router.get("/keys", response_class=HTMLResponse)
async def keys_page(request: Request, state: Console, who: Viewer = Depends(viewer), tenant: str | None = None,
                    done: str | None = None, service: GatewayService = Depends(get_service)
                    ) -> HTMLResponse:
    chosen = pick_tenant(service, who, tenant)
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
    index = await refreshed_index(state)
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
    return render(state, request, "keys.html", who, tenant=chosen, tenants=tenants_of(service, who), status=status,
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
    return render(state, request, "revoke.html", who, tenant=tenant, error=None)


@router.post("/keys/revoke", dependencies=[Depends(same_origin)])
async def revoke(request: Request, state: Console, tenant: str = Form(..., max_length=64), confirm: str = Form(""),
                 csrf: str = Form(""), who: Viewer = Depends(viewer)) -> Response:
    check_csrf(request, csrf, who)
    if who.role not in REVOKE_ROLES:
        raise ConsoleForbidden("the auditor role is read-only")
    if not who.sees(tenant):
        raise ConsoleForbidden("no such tenant")
    if confirm != tenant:
        response = render(state, request, "revoke.html", who, tenant=tenant,
                          error="type the tenant's name exactly to confirm")
        response.status_code = 400
        return response
    try:
        await asyncio.to_thread(state.broker.revoke, tenant, broker_token(request))
    except BrokerUnavailable as exc:
        _record(state, who, tenant, "deny", str(exc))
        response = render(state, request, "revoke.html", who, tenant=tenant, error=f"not revoked: {exc}")
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
