"""The result of every policy evaluation: allowed or not, and exactly which rule decided."""

from __future__ import annotations

from dataclasses import dataclass

from policy.errors import PolicyError

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


class PolicyDenied(PolicyError):
    """A decision said no; ``.decision`` says which policy, version and rule, and why."""

    def __init__(self, decision: Decision) -> None:
        self.decision = decision
        reasons = "; ".join(decision.reasons) or "no reason given"
        super().__init__(
            f"denied by {decision.policy_id} v{decision.policy_version} rule {decision.rule}: {reasons}"
        )
