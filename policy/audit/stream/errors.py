"""The audit forwarder's errors (part of the policy package's one error tree)."""

from __future__ import annotations

from policy.errors import PolicyError


class StreamError(PolicyError):
    """Base of the audit forwarder's errors."""


class StreamConfigError(StreamError):
    """A forwarder setting is invalid (nothing starts)."""


class DeliveryError(StreamError):
    """A batch was not acknowledged by its destination; the cursor stays and the batch is retried."""


class CursorError(StreamError):
    """A cursor file is unreadable or does not match the log it claims to follow."""
