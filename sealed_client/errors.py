"""The client's own refusals, in sealed mode's error tree (protocol.sealed.SealedError)."""

from __future__ import annotations

from attestation.errors import PolicyViolation
from protocol.sealed import SealedError


class UnsealedRequest(SealedError):
    """A request the client cannot seal (an endpoint other than the sealed ones, a base URL without
    `/v1`, a caller's own HTTP client): refused before anything is sent, unless the caller asked for
    plaintext with `unsafe_allow_plaintext`."""


class PinConflict(PolicyViolation):
    """The deployment shows, for a (model, version) this client verified before, another model digest:
    a pin is per (tenant, model, version, model digest), and a package swapped under a version name is
    refused (verify again with a new session to accept a re-published version deliberately)."""
