"""One error tree for sealed mode. Each failure a client or worker can meet has its own type."""

from __future__ import annotations


class SealedError(Exception):
    """Base of every sealed-mode failure; nothing is served after one is raised."""


class SealedFormatError(SealedError):
    """Bytes that are not a sealed message of this version (too short, bad framing, bad header)."""


class WrongWorkerKey(SealedError):
    """The request was sealed to another worker's key than the one opening it."""


class RequestRejected(SealedError):
    """The request does not decrypt under this worker's key with this context (tampered ciphertext,
    or tenant, model, version, endpoint, API key id or policy version changed on the way)."""


class RequestReplayed(SealedError):
    """The same encapsulated key was seen before, or the request is older than the replay window."""


class ResponseCorrupted(SealedError):
    """A response chunk does not decrypt at its position: tampered, dropped, reordered, or the stream
    ended before the final chunk (truncated)."""


class ReceiptInvalid(SealedError):
    """The worker's receipt is unsigned, signed by another key, or does not describe this exchange."""


class ReattestRequired(SealedError):
    """The pinned worker is gone or its key changed: verify the deployment again before sending."""


class DecisionRecordInvalid(SealedError):
    """A sealed decision record that does not open under the tenant's key, is not signed by the
    worker it names, or does not match the audit entry that carried it."""
