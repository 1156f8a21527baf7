"""Single sign-on settings: the enterprise's OpenID Provider (issuer, clients, claim mappings).

A part of the control plane's settings (`GatewaySettings.oidc`), read from a JSON file
(`--oidc-config FILE`, docs/sso.md). Without it the control plane runs in
the local-development mode: shared-secret HS256 tokens (`sealed up`'s default, and it says so).

Roles come from the IdP's claims only through `role_rules`: the first rule whose `value` appears
in the `roles_claim` claim (a string or a list of strings, e.g. `groups`) gives the role; a
tenant role takes its tenant from the rule's `tenant`, else from the `tenant_claim` claim. A token
no rule matches is refused (default deny).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from api.console_settings import loopback_host
from api.errors import SealedApiError

ROLE_NAMES = ("operator", "tenant-admin", "tenant-user", "auditor")
ASYMMETRIC = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA")


class OidcConfigError(SealedApiError, ValueError):
    """The single sign-on settings are incomplete or unsafe."""


@dataclass(frozen=True)
class RoleRule:
    value: str  # a value of the roles claim (a group name, an app role)
    role: str  # one of ROLE_NAMES
    tenant: str | None = None  # for tenant roles: fixed here, else taken from the tenant claim

    def __post_init__(self) -> None:
        if self.role not in ROLE_NAMES:
            raise OidcConfigError(f"role_rules: role must be one of {ROLE_NAMES}, not {self.role!r}")
        if not self.value:
            raise OidcConfigError("role_rules: a rule needs a value")


@dataclass(frozen=True)
class OidcSettings:
    issuer: str  # exactly as the IdP's discovery document and tokens name it
    audience: str  # the management API's audience in the IdP's access tokens
    role_rules: tuple[RoleRule, ...]
    # The console's client (authorization code flow with PKCE); empty: no console SSO.
    client_id: str = ""
    client_secret: str = ""  # a confidential client's secret; empty for a public client (PKCE only)
    redirect_uri: str = ""  # https://<console host>/console/oidc/callback, as registered at the IdP
    post_logout_redirect_uri: str = ""  # where the IdP sends the browser after RP-initiated logout
    scopes: tuple[str, ...] = ("openid", "profile")
    roles_claim: str = "groups"
    tenant_claim: str = "tenant"
    algorithms: tuple[str, ...] = ("RS256", "ES256", "PS256", "EdDSA")
    leeway_s: int = 60  # clock skew allowed on exp, iat, nbf
    http_timeout_s: float = 5.0  # discovery, JWKS and token requests
    jwks_cache_s: int = 300  # the key set is refetched after this, or for an unknown kid ...
    jwks_min_refresh_s: float = 30.0  # ... but not more often than this (unknown kids cannot flood the IdP)
    # Accept the local HS256 management tokens too (the control loop's, `sealed manage`'s) besides
    # the IdP's. Off: only IdP tokens reach the management API.
    accept_local_tokens: bool = False
    # Tests only: an http:// issuer on loopback (every other issuer must be https://).
    unsafe_http_loopback_issuer: bool = False

    def __post_init__(self) -> None:
        for name in ("issuer", "redirect_uri", "post_logout_redirect_uri"):
            value = getattr(self, name)
            if value:
                check_url(value, self.unsafe_http_loopback_issuer, name)
        if not self.audience:
            raise OidcConfigError("audience is required (the management API's audience at the IdP)")
        if not self.role_rules:
            raise OidcConfigError("role_rules is empty: no IdP user could have a role")
        if self.client_id and not self.redirect_uri:
            raise OidcConfigError("console sign-in (client_id) needs redirect_uri")
        if "openid" not in self.scopes:
            raise OidcConfigError("scopes must include openid")
        bad = [a for a in self.algorithms if a not in ASYMMETRIC]
        if bad or not self.algorithms:
            raise OidcConfigError(f"algorithms must be asymmetric JWS algorithms ({ASYMMETRIC}), not {bad}")
        if self.leeway_s < 0 or self.leeway_s > 300 or self.http_timeout_s <= 0 or self.http_timeout_s > 60:
            raise OidcConfigError("leeway_s must be 0..300 and http_timeout_s 0..60")

    @property
    def console_enabled(self) -> bool:
        return bool(self.client_id)

    @classmethod
    def from_file(cls, path: Path) -> OidcSettings:
        try:
            raw = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise OidcConfigError(f"cannot read {path}: {exc}") from exc
        if not isinstance(raw, dict):
            raise OidcConfigError("the OIDC settings file holds one JSON object")
        secret_file = raw.pop("client_secret_file", None)
        if secret_file:
            raw["client_secret"] = Path(secret_file).read_text().strip()
        try:
            raw["role_rules"] = tuple(RoleRule(**r) for r in raw.get("role_rules", ()))
            for name in ("scopes", "algorithms"):
                if name in raw:
                    raw[name] = tuple(raw[name])
            return cls(**raw)
        except TypeError as exc:
            raise OidcConfigError(f"unknown or missing setting: {exc}") from exc


def check_url(url: str, unsafe_http_loopback: bool, name: str = "url") -> None:
    """https:// only; http:// only on loopback with the named Unsafe option (tests)."""
    parts = urlsplit(url)
    if parts.scheme == "https" and parts.hostname:
        return
    if parts.scheme == "http" and unsafe_http_loopback and loopback_host(parts.hostname):
        return
    raise OidcConfigError(f"{name} must be an https:// URL ({url!r})")
