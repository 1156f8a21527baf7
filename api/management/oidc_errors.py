"""The single sign-on error tree: what the management API and the console answer, and audit, when an
IdP token or sign-in is refused."""

from __future__ import annotations

from api.errors import SealedApiError


class OidcError(SealedApiError):
    """A refusal with its HTTP status and a stable code (the code is what the audit entry records)."""

    status = 401
    code = "invalid_token"

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code


class TokenRefused(OidcError):
    """The token is not one of the IdP's for this audience: signature, issuer, audience, expiry, algorithm."""


class RoleRefused(OidcError):
    """A valid token whose claims map to no role (or a tenant role without a usable tenant)."""

    status = 403
    code = "no_role"


class IdpUnavailable(OidcError):
    """The IdP's discovery document or key set could not be fetched in time."""

    status = 503
    code = "idp_unavailable"
