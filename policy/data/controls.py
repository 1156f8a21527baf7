"""Content decisions in the worker: detectors produce facts, Cedar decides, then redaction.

Content never leaves this module in a verdict except as the (possibly redacted) text handed back
to the caller in worker memory; findings carry types and counts only, which is what may be logged.
"""

from __future__ import annotations

import functools
import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from policy.data.pii import detect_pii, redact
from policy.decision import DEFAULT_DENY, Decision
from policy.engine import authorize, uid
from policy.model import PII_TYPES, DataPolicy
from policy.policyset import PolicySet


@dataclass(frozen=True)
class ContentVerdict:
    decision: Decision
    text: str  # redacted text when allowed, "" when denied
    findings: Mapping[str, int]  # entity type or rule id -> count (safe to log)
    redacted: bool


@functools.lru_cache(maxsize=256)
def _compiled(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern)


def _topic_hits(data: DataPolicy, lowered: str) -> list[str]:
    hits = []
    for rid, words in data.blocked_topics.items():
        if any(re.search(r"(?<!\w)" + re.escape(w) + r"(?!\w)", lowered) for w in words):
            hits.append(rid)
    return hits


def retention_cutoff(policy_set: PolicySet, now: datetime) -> datetime | None:
    """Oldest time from which this tenant's decision metadata must be kept; older may be purged.

    None when the tenant declared no retention (keep per operator default). Content is never stored,
    so there is nothing else to purge.
    """
    if policy_set.data is None or policy_set.data.retention_days <= 0:
        return None
    return now - timedelta(days=policy_set.data.retention_days)


def check_content(policy_set: PolicySet, api_key: str, model: str, text: str, *,
                  direction: str = "input") -> ContentVerdict:
    """Scan ``text`` (a prompt when direction="input", a completion when "output") and decide."""
    if direction not in ("input", "output"):
        raise ValueError("direction must be 'input' or 'output'")
    data = policy_set.data
    if data is None:
        deny = Decision(False, policy_set.policy_id, policy_set.version, DEFAULT_DENY,
                        ("tenant has no data policy",))
        return ContentVerdict(deny, "", {}, False)
    findings = detect_pii(text, PII_TYPES)
    counts = Counter(f.entity for f in findings)
    patterns = [rid for rid, rx in data.blocked_patterns.items() if _compiled(rx).search(text)]
    topics = _topic_hits(data, text.lower())
    counts.update(patterns)
    counts.update(topics)
    context = {"pii": sorted({f.entity for f in findings}), "blocked_patterns": patterns,
               "blocked_topics": topics}
    decision = authorize(policy_set.compiled, policy_id=policy_set.policy_id, version=policy_set.version,
                         principal=uid("ApiKey", api_key),
                         action="submit" if direction == "input" else "emit",
                         resource=uid("Model", model), context=context,
                         entities=[{"uid": uid("ApiKey", api_key), "attrs": {},
                                    "parents": [uid("Tenant", policy_set.tenant)]}])
    if not decision.allowed:
        return ContentVerdict(decision, "", dict(counts), False)
    actions = data.pii_input if direction == "input" else data.pii_output
    to_redact = [f for f in findings if actions.get(f.entity) == "redact"]
    return ContentVerdict(decision, redact(text, to_redact) if to_redact else text, dict(counts),
                          bool(to_redact))
