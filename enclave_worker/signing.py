"""What the worker signs about a request: its usage record and its in-enclave policy decisions.

Both are signed with the worker's usage key, the Ed25519 key bound into its attestation evidence,
so the gateway (outside the trust boundary) can neither invent nor alter them. This is the one
place that decides what the records carry and how decisions travel (today: gRPC trailing
metadata, `policy/audit/worker_record.py`); the plaintext and sealed paths both go through it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from enclave_worker.guard import GuardNote, GuardRefusal
from policy.audit.worker_record import DECISION_METADATA_KEY, public_key_bytes, sign_decision
from protocol.rpc import worker_pb2


class RequestIds(Protocol):
    """Who a record is about: a `GenerateRequest` (one choice) or a `SealedRequest` (a whole answer)."""

    @property
    def request_id(self) -> str: ...

    @property
    def tenant(self) -> str: ...

    @property
    def key_id(self) -> str: ...


@dataclass(frozen=True)
class RequestSigner:
    """Signs the records of this worker's requests (the model version it serves is in each)."""

    key: Ed25519PrivateKey
    model: str
    version: str

    def usage(self, ids: RequestIds, prompt_tokens: int, completion_tokens: int, worker_seconds: float,
              at: float) -> worker_pb2.UsageRecord:
        """The usage record the gateway meters (and bills) after checking its signature."""
        record = {"request_id": ids.request_id, "tenant": ids.tenant, "key_id": ids.key_id,
                  "model": self.model, "version": self.version, "prompt_tokens": prompt_tokens,
                  "completion_tokens": completion_tokens, "worker_seconds": round(worker_seconds, 6), "at": at}
        payload = json.dumps(record, sort_keys=True, separators=(",", ":")).encode()
        return worker_pb2.UsageRecord(payload=payload, signature=self.key.sign(payload),
                                      public_key=public_key_bytes(self.key))

    def decisions(self, ids: RequestIds, notes: Sequence[GuardNote], refusal: GuardRefusal | None,
                  at: float) -> tuple[worker_pb2.UsageRecord, ...]:
        """One signed record per decision worth auditing: the notes (redactions, calls held for
        approval) and the refusal that ended the request, if any. Ids and rules, never content."""
        items = [(n.action, n.outcome, n.decision) for n in notes]
        if refusal is not None and refusal.decision is not None:
            items.append((refusal.action, "deny", refusal.decision))
        out = []
        for action, outcome, decision in items:
            payload, signature = sign_decision(
                self.key, request_id=ids.request_id[:128], tenant=ids.tenant[:128], key_id=ids.key_id[:128],
                model=self.model, version=self.version, action=action, decision=outcome, rule=decision.rule[:128],
                policy_id=decision.policy_id[:128], policy_version=decision.policy_version, at=round(at, 3))
            out.append(worker_pb2.UsageRecord(payload=payload, signature=signature,
                                              public_key=public_key_bytes(self.key)))
        return tuple(out)


def decision_metadata(records: Iterable[worker_pb2.UsageRecord]) -> tuple[tuple[str, bytes], ...]:
    """Signed decisions as gRPC trailing metadata (the gateway verifies and audits each)."""
    return tuple((DECISION_METADATA_KEY, r.SerializeToString()) for r in records)
