"""Browser sessions: a management token is exchanged once for an HttpOnly, SameSite=Strict cookie.

The cookie holds a console session token (HS256 JWT, audience ``sealed-console``) signed with the
management API's key, so any gateway replica accepts it and nothing is kept server side. It
carries the same subject, role and tenant as the management token it was exchanged for, and
expires with it (or after ``session_ttl_s``, whichever is first). State-changing forms carry a
CSRF token: an HMAC of the session's id under the same key (double submit, bound to the session).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import secrets

import jwt
from fastapi import Depends, Request

from api.management.auth import AUDIENCE, ROLES, Principal

COOKIE = "sealed_console"
SESSION_AUDIENCE = "sealed-console"
CONSOLE_ROLES = ("operator", "tenant-admin", "auditor")


class ConsoleAuthError(Exception):
    """Not logged in (or the session expired): the page redirects to the login form."""


class ConsoleForbidden(Exception):
    """Logged in, but the role may not see or do this."""


def _secret(request: Request) -> str:
    secret = request.app.state.service.settings.jwt_secret
    if not secret:
        raise ConsoleForbidden("console disabled: no management JWT secret configured")
    return secret


def exchange(secret: str, management_token: str, ttl_s: int, now: dt.datetime | None = None) -> str:
    """A session token for a valid management token of a console role; raises ConsoleAuthError."""
    now = now or dt.datetime.now(dt.UTC)
    try:
        claims = jwt.decode(management_token.strip(), secret, algorithms=["HS256"], audience=AUDIENCE,
                            options={"require": ["exp", "sub", "aud"]})
    except jwt.PyJWTError as exc:
        raise ConsoleAuthError("invalid management token") from exc
    role = claims.get("role")
    if role not in ROLES or role not in CONSOLE_ROLES:
        raise ConsoleForbidden(f"role {role!s} has no console access")
    tenant = claims.get("tenant")
    if role == "tenant-admin" and not tenant:
        raise ConsoleForbidden("tenant-admin token without a tenant")
    expires = min(int(claims["exp"]), int((now + dt.timedelta(seconds=ttl_s)).timestamp()))
    return jwt.encode({"sub": str(claims["sub"]), "role": role, "tenant": tenant, "aud": SESSION_AUDIENCE,
                       "iat": int(now.timestamp()), "exp": expires, "jti": secrets.token_hex(16)},
                      secret, algorithm="HS256")


def read_session(secret: str, token: str) -> tuple[Principal, str]:
    """The principal and session id of a session cookie; raises ConsoleAuthError."""
    try:
        claims = jwt.decode(token, secret, algorithms=["HS256"], audience=SESSION_AUDIENCE,
                            options={"require": ["exp", "sub", "aud", "jti"]})
    except jwt.PyJWTError as exc:
        raise ConsoleAuthError("session expired or invalid") from exc
    if claims.get("role") not in CONSOLE_ROLES:
        raise ConsoleAuthError("session for a role without console access")
    return Principal(str(claims["sub"]), claims["role"], claims.get("tenant")), str(claims["jti"])


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


def viewer(request: Request) -> Viewer:
    secret = _secret(request)
    token = request.cookies.get(COOKIE)
    if not token:
        raise ConsoleAuthError("not logged in")
    who, session_id = read_session(secret, token)
    return Viewer(who, csrf_token(secret, session_id))


def check_csrf(request: Request, submitted: str, who: Viewer = Depends(viewer)) -> None:
    if not submitted or not hmac.compare_digest(submitted, who.csrf):
        raise ConsoleForbidden("missing or wrong CSRF token; reload the page and try again")


def set_session_cookie(response, token: str, *, secure: bool, max_age: int) -> None:  # type: ignore[no-untyped-def]
    response.set_cookie(COOKIE, token, max_age=max_age, path="/console", httponly=True, samesite="strict",
                        secure=secure)


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
