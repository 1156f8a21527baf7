"""Management bearer tokens and role checks as chained dependencies.

Tokens are the enterprise IdP's access tokens when single sign-on is configured
(`GatewaySettings.oidc`: api/management/oidc.py validates them, api/management/claims.py maps
their claims to a role), else the local-development mode's HS256 JWTs minted from `jwt_secret`.

Roles: operator (everything), tenant-admin (its own tenant: keys, models, rollouts, policies,
usage), tenant-user (its own tenant's usage and models, read-only), auditor (read-only, all tenants).
"""

from __future__ import annotations

import datetime as dt
import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass

import jwt
from fastapi import Depends, Request

from api.gateway.dependencies import bearer_secret, get_service
from api.gateway.errors import GatewayError
from api.gateway.service import GatewayService
from api.management.claims import identity
from api.management.oidc import OidcVerifier, get_oidc_verifier
from api.management.oidc_errors import OidcError
from api.store.revocation import TokenClaims, TokenRevoked

ROLES = ("operator", "tenant-admin", "tenant-user", "auditor")
_TENANT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_\-]{0,63}$")
AUDIENCE = "sealed-management"


@dataclass(frozen=True)
class Principal:
    subject: str
    role: str
    tenant: str | None
    token_id: str = ""  # the token's jti (what logout and revocation by id name)


def issue_token(secret: str, subject: str, role: str, tenant: str | None = None, ttl_s: int = 3600) -> str:
    if role not in ROLES:
        raise ValueError(f"role must be one of {ROLES}")
    if role.startswith("tenant-") and not tenant:
        raise ValueError("tenant roles need a tenant")
    now = dt.datetime.now(dt.UTC)
    # iat to the microsecond: a revocation of a subject covers tokens issued up to that instant,
    # not the whole second (a token issued right after a revocation must work).
    return jwt.encode({"sub": subject, "role": role, "tenant": tenant, "aud": AUDIENCE, "iat": now.timestamp(),
                       "exp": now + dt.timedelta(seconds=ttl_s), "jti": secrets.token_hex(16)},
                      secret, algorithm="HS256")


def decode_token(secret: str, token: str) -> dict:
    """A management token's claims (signature, audience, expiry; jti and iat for revocation)."""
    return jwt.decode(token, secret, algorithms=["HS256"], audience=AUDIENCE,
                      options={"require": ["exp", "iat", "sub", "aud", "jti"]})


def check_not_revoked(service: GatewayService, claims: dict, who: Principal) -> None:
    """Refuse a token the store has revoked (checked on every request; every replica shares it)."""
    try:
        service.store.revocations.check_token(
            TokenClaims(who.token_id, who.subject, who.tenant, float(claims["iat"])))
    except TokenRevoked as exc:
        raise GatewayError(401, "management token revoked", code="invalid_token") from exc


def principal(request: Request, token: str = Depends(bearer_secret),
              service: GatewayService = Depends(get_service),
              verifier: OidcVerifier | None = Depends(get_oidc_verifier)) -> Principal:
    if verifier is not None and not (verifier.settings.accept_local_tokens and _is_local(token)):
        idp = idp_principal(verifier, token)
        check_not_revoked(service, {"iat": idp.issued_at}, idp.principal)
        request.scope.setdefault("state", {})["audit_tenant"] = idp.principal.tenant
        return idp.principal
    secret = service.settings.jwt_secret
    if not secret:
        raise GatewayError(503, "management API disabled: no JWT secret configured", type_="server_error")
    try:
        claims = decode_token(secret, token)
    except jwt.PyJWTError as exc:
        raise GatewayError(401, "invalid management token", code="invalid_token") from exc
    who = _typed_principal(claims)
    check_not_revoked(service, claims, who)
    # A refusal after this (403, 404, a schema error) is audited under the principal's tenant.
    request.scope.setdefault("state", {})["audit_tenant"] = who.tenant
    return who


@dataclass(frozen=True)
class IdpPrincipal:
    principal: Principal
    issued_at: float
    expires_at: float


def idp_principal(verifier: OidcVerifier, token: str) -> IdpPrincipal:
    """The principal of an IdP access token; a refusal is a GatewayError whose code names the reason
    (the edge audit records it: token_expired, token_wrong_audience, no_role, ...)."""
    try:
        claims = verifier.access_token(token)
        who = identity(claims, verifier.settings, token)
    except OidcError as exc:
        type_ = "permission_error" if exc.status == 403 else (
            "server_error" if exc.status >= 500 else "invalid_request_error")
        raise GatewayError(exc.status, f"management token refused: {exc}", type_=type_, code=exc.code) from exc
    return IdpPrincipal(Principal(who.subject, who.role, who.tenant, who.token_id), who.issued_at,
                        float(claims["exp"]))


def _is_local(token: str) -> bool:
    """An HS256 token (the local mode's); it still needs `jwt_secret` to verify."""
    try:
        return jwt.get_unverified_header(token).get("alg") == "HS256"
    except jwt.PyJWTError:
        return False


def _typed_principal(claims: dict) -> Principal:
    """Claims are typed strictly: a signed token with a wrong-typed claim is refused, never guessed at
    (a tenant role with `tenant: null` must not read as "every tenant", nor a list reach a query)."""
    role, subject, tenant = claims.get("role"), claims.get("sub"), claims.get("tenant")
    jti, iat = claims.get("jti"), claims.get("iat")
    if (not isinstance(subject, str) or not subject or not isinstance(role, str) or not isinstance(jti, str)
            or not jti or len(jti) > 64 or isinstance(iat, bool) or not isinstance(iat, int | float)):
        raise GatewayError(401, "invalid management token", code="invalid_token")
    if role not in ROLES:
        raise GatewayError(403, "unknown role", type_="permission_error", code="forbidden")
    if tenant is not None and (not isinstance(tenant, str) or not _TENANT.match(tenant)):
        raise GatewayError(401, "invalid management token", code="invalid_token")
    if role.startswith("tenant-") and tenant is None:
        raise GatewayError(401, "invalid management token: a tenant role needs a tenant", code="invalid_token")
    return Principal(subject, role, tenant if role.startswith("tenant-") else None, jti)


def require(*roles: str) -> Callable[..., Principal]:
    def check(who: Principal = Depends(principal)) -> Principal:
        if who.role not in roles:
            raise GatewayError(403, f"role {who.role} may not do this", type_="permission_error", code="forbidden")
        return who
    return check


def tenant_scope(*roles: str) -> Callable[..., Principal]:
    """The role must be allowed, and tenant roles only reach their own tenant (path parameter `tenant`)."""
    def check(tenant: str, who: Principal = Depends(require(*roles))) -> Principal:
        if who.role.startswith("tenant-") and who.tenant != tenant:
            # 404, not 403: another tenant's existence is not disclosed.
            raise GatewayError(404, "no such tenant", code="not_found")
        return who
    return check
