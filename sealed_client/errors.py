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


class TenantPinError(PolicyViolation):
    """The worker's key did not come under a release policy the pinned tenant key signed, or that
    policy does not name the worker's image: a second broker, a publisher or the operator cannot add a
    worker to the tenant's set (sealed_client/tenant_pin.py)."""


class PolicyDowngrade(PolicyViolation):
    """The worker's release or data policy is older than the newest this client has seen (in this
    session or, through its state file, an earlier one)."""


class WorkerRevoked(PolicyViolation):
    """The tenant's signed revocation list revokes the key, policy or data key the worker names."""


class ClientStateError(PolicyViolation):
    """The client's state file is missing, unreadable or malformed: nothing is accepted (fail closed)."""


class HistoryMismatch(SealedError):
    """A sealed /v1/responses answer does not state, in its sealed head, that it continued exactly the
    stored response the request named (sealed_client/stored_state.py)."""


class ConversationMismatch(HistoryMismatch):
    """A sealed answer on a conversation does not state, in its sealed head, that it opened the
    conversation the request named, or states a state older than (or other than) one this client saw
    (rolled back, or changed under the same version; sealed_client/conversation_state.py)."""
