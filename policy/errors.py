"""The one error tree of the policy package.

Every check in ``policy`` raises one of these; callers catch ``PolicyError`` to handle them all.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # only for the annotation; decision.py imports nothing from here at runtime
    from policy.decision import Decision


class PolicyError(Exception):
    """Base of every error raised by the policy package."""


class PolicyDenied(PolicyError):
    """A decision said no; ``.decision`` says which policy, version and rule, and why."""

    def __init__(self, decision: Decision) -> None:
        self.decision = decision
        reasons = "; ".join(decision.reasons) or "no reason given"
        super().__init__(
            f"denied by {decision.policy_id} v{decision.policy_version} rule {decision.rule}: {reasons}"
        )


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
