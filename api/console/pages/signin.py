"""Signing in and out of the console with a local management token (single sign-on: api/console/sso.py)."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Form, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from api.console.broker_token import delete_broker_cookie
from api.console.pages.render import render
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
from api.console.state import Console
from api.gateway.dependencies import get_service
from api.gateway.service import GatewayService
from api.management.oidc import OidcVerifier, get_oidc_verifier

router = APIRouter(prefix="/console", include_in_schema=False)


@router.get("/login", response_class=HTMLResponse)
def login_form(request: Request, console: Console, error: str | None = None) -> HTMLResponse:
    return render(console, request, "login.html", None, error=error)


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
        response = render(state, request, "login.html", None, error=str(exc))
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
