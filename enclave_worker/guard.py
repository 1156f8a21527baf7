"""In-enclave policy: data and tool-use controls applied inside the trust boundary.

Prompts are checked (PII, blocked patterns and topics; redacted or refused) before the engine
sees them; answers are checked before they leave the worker, and so are the tool calls the model
generates. The tenant's policy set arrives as a document signed by a tenant admin, verified here
against the admin key that is part of the worker's measured configuration: the control plane can
deliver a policy but cannot forge one.
"""

from __future__ import annotations

import json
import logging
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from enclave_worker.chat_format import message_text
from policy.admission import AdmissionFacts, evaluate_admission
from policy.agents import KillSwitch, SessionState, ToolCall, check_tool_calls, refusal_message
from policy.data import check_content
from policy.decision import Decision
from policy.documents import verify_policy_document
from policy.policyset import PolicySet
from protocol.toolcalls import parse_tool_calls

log = logging.getLogger(__name__)


class GuardRefusal(Exception):
    """A request or answer is refused by the tenant's policy. The message names the rule, never content."""

    def __init__(self, message: str, action: str = "", decision: Decision | None = None) -> None:
        super().__init__(message)
        self.action = action  # admission | content-input | content-output | tool-call (the audited decision)
        self.decision = decision


@dataclass(frozen=True)
class GuardNote:
    """A decision worth auditing that let the request go on (a redaction, a call held for approval)."""

    action: str
    outcome: str  # "redact" | "requires_approval"
    decision: Decision


def load_policy_set(document: Path, admin_key: Path, tenant: str, min_version: int = 0) -> PolicySet:
    """Verify a signed policy document with the measured admin key; it must be for this tenant and
    at least the measured floor's version (an operator cannot roll the tenant's policy back)."""
    key = serialization.load_pem_public_key(admin_key.read_bytes())
    if not isinstance(key, Ed25519PublicKey):
        raise ValueError("the tenant policy admin key must be Ed25519")
    envelope = json.loads(document.read_text())
    policy_set = verify_policy_document(envelope, {tenant: {str(envelope.get("key_id")): key}})
    if policy_set.tenant != tenant:
        raise ValueError("policy document is for another tenant")
    if policy_set.version < min_version:
        raise ValueError(f"tenant policy version {policy_set.version} is older than this worker's floor {min_version}")
    return policy_set


@dataclass
class WorkerGuard:
    """None as policy set means the operator chose `--unsafe-no-tenant-policy`: no controls."""

    policy_set: PolicySet | None
    kill_switch: KillSwitch = field(default_factory=KillSwitch)
    _sessions: dict[str, SessionState] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def buffers_output(self) -> bool:
        """Output controls need the whole answer before any of it may leave the worker."""
        data = self.policy_set.data if self.policy_set else None
        return bool(data and (data.pii_output or data.blocked_patterns or data.blocked_topics))

    def check_admission(self, key_id: str, model: str, context_tokens: int, max_output_tokens: int) -> None:
        """The signed policy set's admission limits (allowed models, context and output caps), on
        the token counts the engine will run. A policy set without an `admission` section sets none
        (the gateway's rate limits and budgets still apply); with one, it is default deny."""
        if self.policy_set is None or self.policy_set.admission is None:
            return
        decision = evaluate_admission(self.policy_set, AdmissionFacts(
            self.policy_set.tenant, key_id, model, context_tokens, max_output_tokens))
        if not decision.allowed:
            raise GuardRefusal(f"request refused by admission policy (rule {decision.rule})", "admission", decision)

    def check_input(self, key_id: str, model: str, texts: list[str],
                    notes: list[GuardNote] | None = None) -> list[str]:
        if self.policy_set is None:
            return texts
        out = []
        for text in texts:
            verdict = check_content(self.policy_set, key_id, model, text, direction="input")
            if not verdict.decision.allowed:
                raise GuardRefusal(f"request blocked by data policy (rule {verdict.decision.rule})",
                                   "content-input", verdict.decision)
            if verdict.redacted and notes is not None:
                notes.append(GuardNote("content-input", "redact", verdict.decision))
            out.append(verdict.text)
        return out

    def check_messages(self, key_id: str, model: str, messages: list[dict[str, Any]],
                       notes: list[GuardNote] | None = None) -> list[dict[str, Any]]:
        """Chat messages with data controls applied to every text the model will read. A checked
        message keeps only its role and its text (list-form parts and earlier tool calls flattened
        as the template would render them), so a redaction reaches the model exactly as checked."""
        if self.policy_set is None:
            return messages
        texts = self.check_input(key_id, model, [message_text(m) for m in messages], notes)
        return [{"role": m.get("role", "user"), "content": text} for m, text in zip(messages, texts, strict=True)]

    def check_output(self, key_id: str, model: str, text: str, notes: list[GuardNote] | None = None) -> str:
        if self.policy_set is None or not self.buffers_output:
            return text
        verdict = check_content(self.policy_set, key_id, model, text, direction="output")
        if not verdict.decision.allowed:
            raise GuardRefusal(f"answer withheld by data policy (rule {verdict.decision.rule})",
                               "content-output", verdict.decision)
        if verdict.redacted and notes is not None:
            notes.append(GuardNote("content-output", "redact", verdict.decision))
        return verdict.text

    def check_forced_call(self, key_id: str, prefix: str, killed: bool = False) -> None:
        """A call the request forces by name (its assistant prefix opens it) to a tool outside the
        agent's allowlist, or with the agent killed, is refused before the engine runs: no byte of a
        forbidden call is generated, however max_tokens cuts the answer. Its arguments do not exist
        yet, so only the name is judged here (on a fresh session: nothing counts against the caps);
        the whole call is checked again when the answer is complete (check_tools)."""
        if self.policy_set is None or not prefix:
            return
        agent = self.policy_set.agents.get(key_id)
        allowed = agent.tools if agent is not None else {}
        for call in parse_tool_calls(prefix).calls:
            if call.name in allowed and not allowed[call.name].denied and not killed:
                continue
            verdicts = check_tool_calls(self.policy_set, key_id, SessionState(key_id), [ToolCall(call.name, {})],
                                        kill_switch=self.kill_switch, killed=killed)
            denied = verdicts.by_outcome("deny")
            if denied:
                raise GuardRefusal(refusal_message(call.name, denied[0].decision.rule), "tool-call", denied[0].decision)

    def session(self, key_id: str) -> SessionState:
        """The agent key's session: its tool calls counted so far."""
        with self._lock:
            return self._sessions.setdefault(key_id, SessionState(key_id))

    def check_tools(self, key_id: str, text: str, killed: bool = False, notes: list[GuardNote] | None = None) -> str:
        """Refuse denied calls; strip calls that need approval and say so. Returns the finish reason
        override ("requires_approval") or "". ``killed``: the gateway reports the key's kill switch
        set (it can only narrow what the signed policy allows)."""
        if self.policy_set is None:
            return ""
        # The same parser the gateway uses: every call it could hand to the client is checked here,
        # including one cut off by max_tokens that it would repair.
        calls = [ToolCall(c.name, c.arguments) for c in parse_tool_calls(text).calls]
        if not calls:
            return ""
        verdicts = check_tool_calls(self.policy_set, key_id, self.session(key_id), calls, kill_switch=self.kill_switch,
                                    killed=killed)
        denied = verdicts.by_outcome("deny")
        if denied:
            raise GuardRefusal(refusal_message(denied[0].call.name, denied[0].decision.rule), "tool-call",
                               denied[0].decision)
        held = verdicts.by_outcome("requires_approval")
        if held and notes is not None:
            notes.append(GuardNote("tool-call", "requires_approval", held[0].decision))
        return "requires_approval" if held else ""


def build_guard(policy_file: Path | None, admin_key: Path | None, tenant: str, unsafe_no_policy: bool,
                min_version: int = 0) -> WorkerGuard:
    if policy_file is None or admin_key is None:
        if min_version:
            raise ValueError("this worker's init-data sets a tenant policy floor: it needs the signed policy")
        if not unsafe_no_policy:
            raise ValueError("a signed tenant policy is required (or --unsafe-no-tenant-policy)")
        log.warning("UNSAFE: no tenant policy; data and tool-use controls are off in this worker")
        return WorkerGuard(None)
    return WorkerGuard(load_policy_set(policy_file, admin_key, tenant, min_version))
