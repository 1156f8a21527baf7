"""The result of every policy evaluation: allowed or not, and exactly which rule decided."""

from __future__ import annotations

from dataclasses import dataclass

from policy.errors import PolicyDenied

DEFAULT_DENY = "default-deny"


@dataclass(frozen=True)
class Decision:
    """One decision. ``rule`` is the Cedar policy id that decided, or ``"default-deny"``."""

    allowed: bool
    policy_id: str
    policy_version: int
    rule: str
    reasons: tuple[str, ...] = ()

    def require(self) -> None:
        """Raise ``PolicyDenied`` unless allowed, so a forgotten check cannot pass silently."""
        if not self.allowed:
            raise PolicyDenied(self)

    @property
    def verdict(self) -> str:
        """The audit-log spelling of the outcome."""
        return "allow" if self.allowed else "deny"
