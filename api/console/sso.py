"""Console sign-in through the enterprise's IdP: OpenID Connect authorization code flow with PKCE.

`GET /console/oidc/start` sends the browser to the IdP with a fresh state, nonce and PKCE verifier
(S256; Authlib builds the request), kept in a short-lived signed cookie on `/console/oidc` only
(SameSite=Lax: the IdP's redirect back is a cross-site navigation). `GET /console/oidc/callback`
checks the state, redeems the code with the verifier (Authlib), validates the ID token against the
IdP's keys (issuer, audience = the client id, expiry, nonce), maps its claims to a role
(api/management/claims.py) and opens a console session (api/console/session.py) that ends with the
ID token, or earlier by logout or revocation; signing in again asks the IdP again, so a user the
IdP has removed from the group gets no new session. Every sign-in, allowed or refused, is in the
console's audit log.
"""

from __future__ import annotations

import datetime as dt
import hmac
import logging
import secrets
from urllib.parse import urlencode

import httpx
import jwt
from authlib.common.errors import AuthlibBaseError
from authlib.integrations.httpx_client import OAuth2Client
from fastapi import APIRouter, Depends, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from api.console.session import (
    CONSOLE_ROLES,
    ConsoleForbidden,
    cookie_secure,
    open_session,
    set_session_cookie,
)
from api.console.state import Console, ConsoleState
from api.gateway.dependencies import get_service
from api.gateway.service import GatewayService
from api.management.auth import Principal
from api.management.claims import identity
from api.management.oidc import OidcVerifier, ProviderMetadata, get_oidc_verifier
from api.management.oidc_errors import IdpUnavailable, OidcError, RoleRefused, TokenRefused

log = logging.getLogger(__name__)
STATE_COOKIE = "sealed_console_oidc"
STATE_AUDIENCE = "sealed-console-oidc"
STATE_TTL_S = 600

router = APIRouter(prefix="/console/oidc", include_in_schema=False)


async def sso_verifier(verifier: OidcVerifier | None = Depends(get_oidc_verifier)) -> OidcVerifier:
    if verifier is None or not verifier.settings.console_enabled:
        raise ConsoleForbidden("single sign-on is not configured for the console")
    return verifier


def _client(verifier: OidcVerifier) -> OAuth2Client:
    s = verifier.settings
    return OAuth2Client(client_id=s.client_id, client_secret=s.client_secret or None, scope=" ".join(s.scopes),
                        redirect_uri=s.redirect_uri, code_challenge_method="S256", timeout=s.http_timeout_s,
                        token_endpoint_auth_method="client_secret_basic" if s.client_secret else "none")


@router.get("/start")
def start(request: Request, console: Console, service: GatewayService = Depends(get_service),
          verifier: OidcVerifier = Depends(sso_verifier)) -> Response:
    meta = _metadata(verifier)
    state, nonce, code_verifier = secrets.token_urlsafe(24), secrets.token_urlsafe(24), secrets.token_urlsafe(48)
    with _client(verifier) as client:
        url, _ = client.create_authorization_url(meta.authorization_endpoint, state=state, nonce=nonce,
                                                 code_verifier=code_verifier)
    now = int(dt.datetime.now(dt.UTC).timestamp())
    pending = jwt.encode({"aud": STATE_AUDIENCE, "exp": now + STATE_TTL_S, "state": state, "nonce": nonce,
                          "cv": code_verifier}, _secret(service), algorithm="HS256")
    response = RedirectResponse(url, status_code=303)
    response.set_cookie(STATE_COOKIE, pending, max_age=STATE_TTL_S, path="/console/oidc", httponly=True,
                        samesite="lax", secure=_secure(console, request))
    return response


@router.get("/callback")
def callback(request: Request, console: Console, code: str = "", state: str = "", error: str = "", iss: str = "",
             service: GatewayService = Depends(get_service),
             verifier: OidcVerifier = Depends(sso_verifier)) -> Response:
    try:
        who, expires = _sign_in(request, service, verifier, code, state, error, iss)
    except OidcError as exc:
        _audit(console, None, "deny", f"{exc.code}: {exc}")
        return _refused(console, request, exc)
    secret, settings = _secret(service), console.settings
    now = dt.datetime.now(dt.UTC)
    session = open_session(secret, who, expires, settings.session_ttl_s, service.store.revocations, now)
    _audit(console, who, "allow", "signed in through the IdP")
    # A page, not a redirect: after the IdP's cross-site redirect a browser would not send the
    # SameSite=Strict session cookie on a redirect chain; a navigation from this page does.
    response: Response = console.templates.TemplateResponse(request, "signed_in.html", {"who": None})
    set_session_cookie(response, session, secure=_secure(console, request), max_age=settings.session_ttl_s)
    response.delete_cookie(STATE_COOKIE, path="/console/oidc")
    return response


def _sign_in(request: Request, service: GatewayService, verifier: OidcVerifier, code: str, state: str, error: str,
             iss: str) -> tuple[Principal, int]:
    if error:
        raise TokenRefused(f"the IdP refused the sign-in ({error[:64]})", code="idp_refused")
    try:
        pending = jwt.decode(request.cookies.get(STATE_COOKIE, ""), _secret(service), algorithms=["HS256"],
                             audience=STATE_AUDIENCE, options={"require": ["exp", "aud"]})
    except jwt.PyJWTError as exc:
        raise TokenRefused("sign-in expired or started elsewhere; sign in again", code="sso_state") from exc
    if not state or not hmac.compare_digest(str(pending.get("state")), state):
        raise TokenRefused("sign-in state does not match; sign in again", code="sso_state")
    meta = _metadata(verifier)
    if iss and iss != meta.issuer:  # RFC 9207: the response names the issuer it came from
        raise TokenRefused("the sign-in response names another issuer", code="token_wrong_issuer")
    try:
        with _client(verifier) as client:
            token = client.fetch_token(meta.token_endpoint, code=code, code_verifier=pending["cv"],
                                       grant_type="authorization_code")
    except (AuthlibBaseError, ValueError) as exc:
        raise TokenRefused(f"the IdP did not redeem the code ({type(exc).__name__})", code="code_refused") from exc
    except httpx.HTTPError as exc:
        raise IdpUnavailable(f"token request failed ({type(exc).__name__})") from exc
    id_token = token.get("id_token")
    if not isinstance(id_token, str):
        raise TokenRefused("the IdP returned no ID token", code="token_malformed")
    claims = verifier.id_token(id_token, str(pending.get("nonce")))
    who = identity(claims, verifier.settings, id_token)
    if who.role not in CONSOLE_ROLES:
        raise RoleRefused(f"role {who.role} has no console access", code="no_console_role")
    return Principal(who.subject, who.role, who.tenant, who.token_id), int(claims["exp"])


def end_session_url(verifier: OidcVerifier | None) -> str | None:
    """Where to send the browser after logout so that the IdP ends its session too (RP-initiated
    logout), or None (no SSO, or the IdP publishes no end_session_endpoint)."""
    if verifier is None or not verifier.settings.console_enabled:
        return None
    try:
        meta = verifier.metadata()
    except IdpUnavailable:
        return None
    if not meta.end_session_endpoint:
        return None
    params = {"client_id": verifier.settings.client_id}
    if verifier.settings.post_logout_redirect_uri:
        params["post_logout_redirect_uri"] = verifier.settings.post_logout_redirect_uri
    return meta.end_session_endpoint + ("&" if "?" in meta.end_session_endpoint else "?") + urlencode(params)


def _metadata(verifier: OidcVerifier) -> ProviderMetadata:
    try:
        return verifier.metadata()
    except IdpUnavailable as exc:
        raise ConsoleForbidden("the identity provider is unreachable; try again later") from exc


def _secret(service: GatewayService) -> str:
    secret: str = service.settings.jwt_secret
    if not secret:
        raise ConsoleForbidden("console disabled: no session key (--jwt-secret-file) configured")
    return secret


def _secure(console: ConsoleState, request: Request) -> bool:
    return cookie_secure(request, console.settings.unsafe_plain_http_loopback)


def _refused(console: ConsoleState, request: Request, exc: OidcError) -> HTMLResponse:
    response: HTMLResponse = console.templates.TemplateResponse(
        request, "login.html", {"who": None, "sso": True, "error": f"Sign-in refused: {exc}"})
    response.status_code = 503 if isinstance(exc, IdpUnavailable) else exc.status
    response.delete_cookie(STATE_COOKIE, path="/console/oidc")
    return response


def _audit(console: ConsoleState, who: Principal | None, decision: str, reason: str) -> None:
    """The sign-in in the console's signed audit log (and the process log); never the tokens."""
    subject = who.subject[:128] if who is not None else "-"
    log.warning("console sign-in via IdP: %s %s (%s)", subject, decision, reason)
    audit = console.audit_log()
    if audit is None:
        return
    meta = {"actor": subject, "role": who.role if who else "-", "via": "oidc"}
    audit.append(tenant=(who.tenant if who else None) or "-", action="console-sign-in", decision=decision,
                 reason=reason[:200], metadata=meta)
    audit.flush()
