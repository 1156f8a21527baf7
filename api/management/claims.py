"""The IdP's claims mapped to a role and a tenant (OidcSettings.role_rules; default deny)."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Any

from api.management.oidc_errors import RoleRefused, TokenRefused
from api.oidc_settings import OidcSettings

_TENANT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_\-]{0,63}$")


@dataclass(frozen=True)
class Identity:
    subject: str
    role: str
    tenant: str | None  # set for tenant roles only
    token_id: str  # the token's jti (or, where the IdP sets none, a digest of the token)
    issued_at: float


def identity(claims: dict[str, Any], settings: OidcSettings, token: str) -> Identity:
    """Who a verified token names; raises RoleRefused (no rule matches, no usable tenant) or TokenRefused."""
    subject, iat = claims.get("sub"), claims.get("iat")
    if not isinstance(subject, str) or not subject or len(subject) > 255:
        raise TokenRefused("token has no usable subject", code="token_bad_claims")
    if isinstance(iat, bool) or not isinstance(iat, int | float):
        raise TokenRefused("token has no usable iat", code="token_bad_claims")
    jti = claims.get("jti")
    if not isinstance(jti, str) or not jti or len(jti) > 64:
        jti = "sha256:" + hashlib.sha256(token.encode()).hexdigest()[:40]
    values = claims.get(settings.roles_claim)
    if isinstance(values, str):
        values = [values]
    if not isinstance(values, list) or not values:
        raise RoleRefused(f"token has no {settings.roles_claim!r} claim to map to a role", code="role_claim_missing")
    held = {v for v in values if isinstance(v, str)}
    rule = next((r for r in settings.role_rules if r.value in held), None)
    if rule is None:
        raise RoleRefused(f"no role for this token's {settings.roles_claim!r}", code="no_role")
    if not rule.role.startswith("tenant-"):
        return Identity(subject, rule.role, None, jti, float(iat))
    tenant = rule.tenant if rule.tenant is not None else claims.get(settings.tenant_claim)
    if not isinstance(tenant, str) or not _TENANT.match(tenant):
        raise RoleRefused(f"a tenant role needs a valid {settings.tenant_claim!r} claim", code="tenant_claim_missing")
    return Identity(subject, rule.role, tenant, jti, float(iat))
