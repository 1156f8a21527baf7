"""One error tree for the key broker. At the HTTP edge every refusal becomes one opaque error."""


class KeyBrokerError(Exception):
    """Base of every key broker failure."""


class ReleaseRefused(KeyBrokerError):
    """A challenge, attestation or key request was refused. The precise reason goes to the audit log
    only; callers see the same opaque refusal for every cause."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


class RateLimited(KeyBrokerError):
    """A worker identity or client address exceeded its request rate."""


class KeyStoreError(KeyBrokerError):
    """The key store cannot perform an operation (unknown tenant, revoked key, corrupt entry)."""


class TenantKeyRevoked(KeyStoreError):
    """The tenant's key was revoked: no new releases."""


class InvalidName(KeyBrokerError, ValueError):
    """A tenant, model or version name is not of the allowed form."""


class ReferenceValuesError(KeyBrokerError):
    """A signed reference-values document is malformed, unsigned, badly signed or for another tenant."""


class AuthError(KeyBrokerError):
    """Admin API authentication failed (missing, unknown or revoked bearer token)."""


class Forbidden(KeyBrokerError):
    """An authenticated admin principal may not act on this tenant or operation."""


class SettingsError(KeyBrokerError, ValueError):
    """Broker settings are unsafe or inconsistent (e.g. a placeholder secret outside dev mode)."""


class PolicyUnsigned(Forbidden):
    """A release policy or policy-admin key statement is not signed by the tenant's policy-admin key
    (unsigned, another key, another tenant's, tampered after signing) or does not move the version
    forward. Answered as the opaque 403; the reason is in the audit log."""


class SealedStateError(SettingsError):
    """The broker's sealed keys cannot be opened here (another measurement or platform, edited), or
    plaintext key files of an older broker are on its disk: it refuses to start."""
