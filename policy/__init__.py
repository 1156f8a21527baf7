"""policy: one policy engine (Cedar) for key release, admission, data and tool-use controls,
and the tamper-evident audit log."""

from policy.admission import AdmissionFacts, evaluate_admission
from policy.decision import DEFAULT_DENY, Decision, PolicyDenied
from policy.documents import PolicyRegistry, sign_policy_document, verify_policy_document
from policy.errors import AuditIntegrityError, PolicyError, PolicyInvalid
from policy.limiter import BucketSpec, InMemoryLimiterStore, LimiterStore, TokenBucketLimiter
from policy.model import AgentPolicy, DataPolicy, Limits, ToolRule
from policy.policyset import PolicySet
from policy.release import ReleaseFacts, ReleasePolicy, evaluate_release

__all__ = [
    "DEFAULT_DENY", "AdmissionFacts", "AgentPolicy", "AuditIntegrityError", "BucketSpec",
    "DataPolicy", "Decision", "InMemoryLimiterStore", "LimiterStore", "Limits", "PolicyDenied",
    "PolicyError", "PolicyInvalid", "PolicyRegistry", "PolicySet", "ReleaseFacts", "ReleasePolicy",
    "TokenBucketLimiter", "ToolRule", "evaluate_admission", "evaluate_release", "sign_policy_document",
    "verify_policy_document",
]
