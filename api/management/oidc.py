"""Tokens of the enterprise's OpenID Provider, validated against its published keys.

Discovery (`<issuer>/.well-known/openid-configuration`) and the key set (PyJWT's PyJWKClient) are
fetched lazily, with a timeout, over https only (http only on loopback with the named Unsafe test
option), and cached: the key set for `jwks_cache_s`, refetched for an unknown `kid` at most once per
`jwks_min_refresh_s`. A token is accepted only when signed with one of those keys by an allowed
asymmetric algorithm (`alg: none` and HS256 are refused before any key is looked at), issued by
the configured issuer, for the expected audience, and unexpired (with `leeway_s` of clock skew).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx
import jwt

from api.management.oidc_errors import IdpUnavailable, TokenRefused
from api.oidc_settings import OidcConfigError, OidcSettings, check_url

log = logging.getLogger(__name__)
REQUIRED = ("exp", "iat", "iss", "aud", "sub")


@dataclass(frozen=True)
class ProviderMetadata:
    """What the control plane uses of the IdP's discovery document."""

    issuer: str
    authorization_endpoint: str
    token_endpoint: str
    jwks_uri: str
    end_session_endpoint: str | None


class OidcVerifier:
    def __init__(self, settings: OidcSettings, clock: Callable[[], float] = time.monotonic) -> None:
        self.settings = settings
        self.clock = clock
        self._failed_at = -math.inf
        self._lock = threading.Lock()
        self._metadata: ProviderMetadata | None = None
        self._jwks: jwt.PyJWKClient | None = None

    # -- the IdP's documents
    def metadata(self) -> ProviderMetadata:
        with self._lock:
            if self._metadata is None:
                # After a failure, answer at once for a while: a down IdP must not hold every
                # request's thread for the timeout.
                if self.clock() - self._failed_at < self.settings.jwks_min_refresh_s:
                    raise IdpUnavailable("OIDC discovery failed recently; retrying later")
                try:
                    self._metadata = self._discover()
                except IdpUnavailable as exc:
                    self._failed_at = self.clock()
                    log.error("single sign-on: the IdP is unavailable: %s", exc)
                    raise
            return self._metadata

    def _discover(self) -> ProviderMetadata:
        s = self.settings
        url = s.issuer.rstrip("/") + "/.well-known/openid-configuration"
        try:
            r = httpx.get(url, timeout=s.http_timeout_s, follow_redirects=False)
            r.raise_for_status()
            doc = r.json()
        except (httpx.HTTPError, ValueError) as exc:
            raise IdpUnavailable(f"OIDC discovery failed ({type(exc).__name__})") from exc
        if not isinstance(doc, dict) or doc.get("issuer") != s.issuer:
            # OIDC Discovery 4.3: the document must name the very issuer it was fetched for.
            raise IdpUnavailable("OIDC discovery: the document names another issuer")
        try:
            meta = ProviderMetadata(str(doc["issuer"]), str(doc["authorization_endpoint"]),
                                    str(doc["token_endpoint"]), str(doc["jwks_uri"]),
                                    doc.get("end_session_endpoint"))
            for name in ("authorization_endpoint", "token_endpoint", "jwks_uri"):
                check_url(getattr(meta, name), s.unsafe_http_loopback_issuer, name)
            if meta.end_session_endpoint:
                check_url(meta.end_session_endpoint, s.unsafe_http_loopback_issuer, "end_session_endpoint")
        except (KeyError, OidcConfigError) as exc:
            raise IdpUnavailable(f"OIDC discovery: unusable document ({exc})") from exc
        return meta

    def _key_set(self) -> jwt.PyJWKClient:
        meta = self.metadata()
        with self._lock:
            if self._jwks is None:
                s = self.settings
                self._jwks = jwt.PyJWKClient(meta.jwks_uri, cache_jwk_set=True, lifespan=s.jwks_cache_s,
                                             timeout=s.http_timeout_s, cooldown_duration=s.jwks_min_refresh_s)
            return self._jwks

    # -- tokens
    def access_token(self, token: str) -> dict[str, Any]:
        """The claims of an IdP access token for the management API; raises TokenRefused or IdpUnavailable."""
        return self._verify(token, self.settings.audience)

    def id_token(self, token: str, nonce: str) -> dict[str, Any]:
        """The claims of the console client's ID token (audience: the client id; the sign-in's nonce)."""
        claims = self._verify(token, self.settings.client_id)
        if claims.get("nonce") != nonce:
            raise TokenRefused("ID token nonce does not match the sign-in", code="token_wrong_nonce")
        return claims

    def _verify(self, token: str, audience: str) -> dict[str, Any]:
        s = self.settings
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError as exc:
            raise TokenRefused("not a signed JWT", code="token_malformed") from exc
        alg, kid = header.get("alg"), header.get("kid")
        if alg not in s.algorithms:
            raise TokenRefused(f"token algorithm {alg!s:.16} is not allowed", code="token_alg_refused")
        if not isinstance(kid, str) or not kid:
            raise TokenRefused("token names no signing key (kid)", code="token_unknown_key")
        try:
            key = self._key_set().get_signing_key(kid)
        except jwt.PyJWKClientConnectionError as exc:
            log.error("single sign-on: the IdP's key set could not be fetched (%s)", type(exc).__name__)
            raise IdpUnavailable("the IdP's key set could not be fetched") from exc
        except jwt.PyJWKClientError as exc:
            raise TokenRefused("token signed by a key the IdP does not publish", code="token_unknown_key") from exc
        try:
            claims: dict[str, Any] = jwt.decode(
                token, key.key, algorithms=[alg], audience=audience, issuer=s.issuer, leeway=s.leeway_s,
                options={"require": list(REQUIRED), "strict_aud": False})
        except jwt.ExpiredSignatureError as exc:
            raise TokenRefused("token expired", code="token_expired") from exc
        except jwt.InvalidAudienceError as exc:
            raise TokenRefused("token is for another audience", code="token_wrong_audience") from exc
        except jwt.InvalidIssuerError as exc:
            raise TokenRefused("token from another issuer", code="token_wrong_issuer") from exc
        except jwt.InvalidSignatureError as exc:
            raise TokenRefused("token signature does not verify", code="token_bad_signature") from exc
        except jwt.PyJWTError as exc:
            raise TokenRefused(f"invalid token ({type(exc).__name__})", code="invalid_token") from exc
        return claims


async def get_oidc_verifier() -> OidcVerifier | None:
    """The control plane's single sign-on verifier, None without single sign-on (the local-development
    mode): `create_app` binds the one it built in this one's place (api/parts.py), a typed dependency
    of the routes, never a service locator on the app."""
    return None
