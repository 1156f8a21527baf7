"""Data controls enforced in the worker: PII detection/redaction, blocked patterns and topics."""

from policy.data.controls import ContentVerdict, check_content, retention_cutoff
from policy.data.pii import Finding, detect_pii, redact

__all__ = ["ContentVerdict", "Finding", "check_content", "detect_pii", "redact", "retention_cutoff"]
