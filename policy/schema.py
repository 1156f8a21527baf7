"""The Cedar schema every tenant-authored rule is validated against on upload.

It fixes the entity types, actions and context attributes the engine passes, so a custom rule
that reads an attribute that does not exist (and would silently never match) is rejected.
Release is evaluated from compiled typed policies only, so it carries a TCB record whose
component names vary by platform and is not part of this schema.
"""

from __future__ import annotations

CEDAR_SCHEMA = """
entity Tenant;
entity ApiKey in [Tenant];
entity Agent in [Tenant];
entity Model;
entity Tool;
action "infer" appliesTo {
  principal: [ApiKey], resource: [Model],
  context: { model: String, context_tokens: Long, max_output_tokens: Long,
             rate_limited: Bool, over_budget: Bool }
};
action "submit", "emit" appliesTo {
  principal: [ApiKey], resource: [Model],
  context: { pii: Set<String>, blocked_patterns: Set<String>, blocked_topics: Set<String> }
};
action "call_tool" appliesTo {
  principal: [Agent], resource: [Tool],
  context: { killed: Bool, args_valid: Bool, urls_allowed: Bool, request_calls: Long,
             session_calls: Long, approved: Bool }
};
"""
