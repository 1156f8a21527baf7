"""Browser sessions: a management token is exchanged once for an HttpOnly, SameSite=Strict cookie.

The cookie holds a console session token (HS256 JWT, audience ``sealed-console``) signed with the
management API's key. It carries the same subject, role and tenant as the management token it was
exchanged for, and expires with it (or after ``session_ttl_s``, whichever is first). Its id (jti)
is recorded in the control-plane store and checked on every request (api/store/revocation.py), so
logout, a revocation (of the session, its management token, its subject or tenant) and tenant
removal end it at once on every replica. State-changing forms carry a CSRF token: an HMAC of the
session's id under the same key (double submit, bound to the session).

The cookie is ``Secure`` except where the operator named the one exception,
``ConsoleSettings.unsafe_plain_http_loopback`` (``--unsafe-console-plain-http-loopback``), and
the request reached the gateway directly over plain HTTP on loopback (``cookie_secure``).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import secrets

import jwt
from fastapi import Depends, Request

from api.console_settings import loopback_host
from api.errors import SealedApiError
from api.gateway.dependencies import get_service
from api.gateway.service import GatewayService
from api.management.auth import ROLES, Principal, decode_token
from api.store.revocation import ConsoleSession, Revocations, TokenClaims, TokenRevoked

COOKIE = "sealed_console"
SESSION_AUDIENCE = "sealed-console"
CONSOLE_ROLES = ("operator", "tenant-admin", "auditor")


class ConsoleAuthError(SealedApiError):
    """Not logged in (or the session expired): the page redirects to the login form."""


class ConsoleForbidden(SealedApiError):
    """Logged in, but the role may not see or do this."""


def _secret(service: GatewayService) -> str:
    secret: str = service.settings.jwt_secret
    if not secret:
        raise ConsoleForbidden("console disabled: no management JWT secret configured")
    return secret


def exchange(secret: str, management_token: str, ttl_s: int, revocations: Revocations,
             now: dt.datetime | None = None) -> str:
    """A session token for a valid, unrevoked management token of a console role, recorded in the
    store; raises ConsoleAuthError or ConsoleForbidden."""
    now = now or dt.datetime.now(dt.UTC)
    try:
        claims = decode_token(secret, management_token.strip())
    except jwt.PyJWTError as exc:
        raise ConsoleAuthError("invalid management token") from exc
    role, subject, tenant = claims.get("role"), claims.get("sub"), claims.get("tenant")
    if role not in ROLES or role not in CONSOLE_ROLES:
        raise ConsoleForbidden(f"role {role!s} has no console access")
    if role == "tenant-admin" and not tenant:
        raise ConsoleForbidden("tenant-admin token without a tenant")
    if not isinstance(subject, str) or not isinstance(claims["jti"], str) or not (
            tenant is None or isinstance(tenant, str)):
        raise ConsoleAuthError("invalid management token")
    tenant = tenant if role == "tenant-admin" else None
    try:
        revocations.check_token(TokenClaims(claims["jti"], subject, tenant, float(claims["iat"])))
    except TokenRevoked as exc:
        raise ConsoleAuthError("management token revoked") from exc
    return open_session(secret, Principal(subject, role, tenant, claims["jti"]), int(claims["exp"]), ttl_s,
                        revocations, now)


def open_session(secret: str, who: Principal, token_expires: int, ttl_s: int, revocations: Revocations,
                 now: dt.datetime) -> str:
    """A session cookie's token for ``who`` (its token_id: the credential it came from), recorded in the
    store; it ends with that credential (``token_expires``) or after ``ttl_s``, whichever is first."""
    expires = min(token_expires, int((now + dt.timedelta(seconds=ttl_s)).timestamp()))
    session = ConsoleSession(secrets.token_hex(16), who.subject, who.role, who.tenant, who.token_id,
                             now.timestamp(), dt.datetime.fromtimestamp(expires, dt.UTC))
    revocations.record_session(session)
    return jwt.encode({"sub": who.subject, "role": who.role, "tenant": who.tenant, "aud": SESSION_AUDIENCE,
                       "iat": int(now.timestamp()), "exp": expires, "jti": session.jti},
                      secret, algorithm="HS256")


def read_session(secret: str, token: str, revocations: Revocations) -> tuple[Principal, str]:
    """The principal and session id of a live session cookie; raises ConsoleAuthError."""
    try:
        claims = jwt.decode(token, secret, algorithms=["HS256"], audience=SESSION_AUDIENCE,
                            options={"require": ["exp", "sub", "aud", "jti"]})
    except jwt.PyJWTError as exc:
        raise ConsoleAuthError("session expired or invalid") from exc
    if claims.get("role") not in CONSOLE_ROLES:
        raise ConsoleAuthError("session for a role without console access")
    try:
        # The store's record, not the cookie's claims, says who this is: they agree unless the key leaked.
        session = revocations.check_session(str(claims["jti"]))
    except TokenRevoked as exc:
        raise ConsoleAuthError("session ended; log in again") from exc
    return Principal(session.subject, session.role, session.tenant, session.jti), session.jti


def csrf_token(secret: str, session_id: str) -> str:
    return hmac.new(secret.encode(), b"sealed-console-csrf\0" + session_id.encode(), hashlib.sha256).hexdigest()


class Viewer:
    """Who is looking, with the session's CSRF token for the forms on the page."""

    def __init__(self, principal: Principal, csrf: str) -> None:
        self.principal = principal
        self.csrf = csrf

    @property
    def role(self) -> str:
        return self.principal.role

    @property
    def tenant(self) -> str | None:
        """The only tenant a tenant admin may see; None for the operator and the auditor (all)."""
        return self.principal.tenant if self.principal.role == "tenant-admin" else None

    def sees(self, tenant: str) -> bool:
        return self.tenant is None or tenant == self.tenant


def viewer(request: Request, service: GatewayService = Depends(get_service)) -> Viewer:
    secret = _secret(service)
    token = request.cookies.get(COOKIE)
    if not token:
        raise ConsoleAuthError("not logged in")
    who, session_id = read_session(secret, token, service.store.revocations)
    return Viewer(who, csrf_token(secret, session_id))


def check_csrf(request: Request, submitted: str, who: Viewer = Depends(viewer)) -> None:
    if not submitted or not hmac.compare_digest(submitted, who.csrf):
        raise ConsoleForbidden("missing or wrong CSRF token; reload the page and try again")


def set_session_cookie(response, token: str, *, secure: bool, max_age: int) -> None:  # type: ignore[no-untyped-def]
    response.set_cookie(COOKIE, token, max_age=max_age, path="/console", httponly=True, samesite="strict",
                        secure=secure)


_FORWARDED = ("x-forwarded-proto", "x-forwarded-for", "x-forwarded-host", "forwarded")


def cookie_secure(request: Request, unsafe_plain_http_loopback: bool) -> bool:
    """Secure, always, unless the operator opted out for plain HTTP on loopback and this request is
    exactly that: scheme http, from a loopback peer to a loopback host, and through no proxy. A
    forwarding header (a TLS terminator's X-Forwarded-Proto, or any proxy's) keeps it Secure: the
    headers are trusted only to add the flag, never to drop it, so a client cannot spoof it away."""
    if not unsafe_plain_http_loopback or request.url.scheme != "http":
        return True
    if any(name in request.headers for name in _FORWARDED):
        return True
    peer = request.client.host if request.client is not None else None
    return not (loopback_host(peer) and loopback_host(request.url.hostname))


def same_origin(request: Request) -> None:
    """Refuse a cross-site form post (login CSRF included): a browser sends Origin on every POST,
    and it must name this host. Requests without Origin (not from a browser form) pass; they
    still need the session and CSRF token where those apply."""
    origin = request.headers.get("origin")
    if origin is None:
        return
    host = request.headers.get("host", "")
    if origin in ("null", "") or origin.split("://", 1)[-1] != host:
        raise ConsoleForbidden("cross-site form post refused")
