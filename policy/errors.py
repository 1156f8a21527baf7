"""The one error tree of the policy package.

Every check in ``policy`` raises one of these; callers catch ``PolicyError`` to handle them all.
``PolicyDenied`` (a decision said no) lives with ``Decision`` in ``policy.decision``: it carries one,
and this module imports no other module of the package.
"""

from __future__ import annotations


class PolicyError(Exception):
    """Base of every error raised by the policy package."""


class PolicyInvalid(PolicyError):
    """A policy document is malformed, unsigned, badly signed, or fails validation."""


class AuditIntegrityError(PolicyError):
    """An audit log failed verification; ``.index`` is the first bad entry (0-based line)."""

    def __init__(self, index: int, reason: str, path: str | None = None) -> None:
        self.index = index
        self.reason = reason
        self.path = path
        where = f"{path}: " if path else ""
        super().__init__(f"{where}audit entry {index}: {reason}")
