"""The tenant checks its bill on its own machine: `sealed usage --verify LEDGER --policy POLICY`.

The ledger is the control plane's export (`sealed usage --export`, format `sealed-usage-ledger-v1`):
each usage row's signed record (base64 of the exact bytes the worker signed), signature and usage
key, what the control plane stored for it, and per usage key the worker's attestation document
(evidence, TLS certificate). Nothing in it is taken on trust:

1. each usage key counts only if hardware evidence binds it, checked against the tenant's own client
   policy (pinned roots, appraisal, tenant): the evidence verifies, its channel binding is SHA-256 over
   the worker's TLS key and this usage key, and its workload claims name this tenant;
2. each record counts only if such a key signed it and it is a usage record of this tenant;
3. a record of the same worker key and request id counts once;
4. a row whose stored fields differ from its signed record is flagged (what the control plane shows
   for it is not what the worker signed); its signed facts are what count.

Everything that fails is listed with the reason; the totals are of the records that pass.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from attestation.bundle import EvidenceBundle, channel_binding
from attestation.client import verify_worker_evidence
from attestation.errors import AttestationError
from protocol.usage_record import LEDGER_FORMAT, UsageRecordInvalid, check_usage_record
from sealed_client.deployment import _spki
from sealed_client.trust import ClientTrust

_COMPARED = ("request_id", "tenant", "key_id", "model", "version", "prompt_tokens", "completion_tokens")


class LedgerInvalid(Exception):
    """The export is not a usage ledger this client can read."""


@dataclass
class LedgerCheck:
    tenant: str
    keys_verified: list[str] = field(default_factory=list)
    keys_refused: dict[str, str] = field(default_factory=dict)  # usage key -> why
    totals: dict[str, dict[str, float]] = field(default_factory=dict)  # API key id -> counts
    flagged: list[dict[str, Any]] = field(default_factory=list)  # record index, request id, reason

    @property
    def clean(self) -> bool:
        return not self.flagged and not self.keys_refused


def _check_key(public_key: str, doc: Any, trust: ClientTrust, now: dt.datetime) -> None:
    if not isinstance(doc, Mapping) or "evidence" not in doc:
        raise LedgerInvalid("no attestation evidence for this usage key")
    try:
        bundle = EvidenceBundle.from_json(dict(doc["evidence"]))
        result, workload = verify_worker_evidence(bundle, trust.evidence_trust, trust.appraisal, now)
        key = bytes.fromhex(public_key)
    except (AttestationError, KeyError, ValueError, TypeError) as exc:
        raise LedgerInvalid(f"the evidence does not verify ({type(exc).__name__}: {exc})") from exc
    if channel_binding(_spki(doc.get("grpc_tls_cert")), key) != result.channel_binding:
        raise LedgerInvalid("the evidence does not bind this usage key")
    if workload.tenant != trust.tenant:
        raise LedgerInvalid(f"the evidence is of a worker of tenant {workload.tenant!r}")


def verify_ledger(export: Any, trust: ClientTrust, now: dt.datetime) -> LedgerCheck:
    if not isinstance(export, Mapping) or export.get("format") != LEDGER_FORMAT:
        raise LedgerInvalid(f"not a {LEDGER_FORMAT} export")
    records, keys = export.get("records"), export.get("usage_keys")
    if not isinstance(records, list) or not isinstance(keys, Mapping):
        raise LedgerInvalid("the export has no records or no usage keys")
    check = LedgerCheck(tenant=trust.tenant)
    for public_key, doc in keys.items():
        try:
            _check_key(str(public_key), doc, trust, now)
            check.keys_verified.append(str(public_key))
        except LedgerInvalid as exc:
            check.keys_refused[str(public_key)] = str(exc)
    seen: set[tuple[str, str]] = set()
    for index, record in enumerate(records):
        try:
            _count(record, check, seen)
        except (UsageRecordInvalid, LedgerInvalid) as exc:
            stored = record.get("stored", {}) if isinstance(record, Mapping) else {}
            check.flagged.append({"index": index, "request_id": str(stored.get("request_id", ""))[:64],
                                  "prompt_tokens": stored.get("prompt_tokens"), "reason": str(exc)})
    return check


def _count(record: Any, check: LedgerCheck, seen: set[tuple[str, str]]) -> None:
    if not isinstance(record, Mapping):
        raise LedgerInvalid("a record is not an object")
    public_key = str(record.get("public_key") or "")
    if public_key not in check.keys_verified:
        raise LedgerInvalid("signed by a key no verified evidence binds" if public_key else "no usage key")
    if not record.get("payload"):
        raise LedgerInvalid("no signed record")
    try:
        payload = base64.b64decode(str(record["payload"]), validate=True)
        signature = bytes.fromhex(str(record.get("signature") or ""))
    except (binascii.Error, ValueError) as exc:
        raise LedgerInvalid("the record or its signature is not encoded as exported") from exc
    facts = check_usage_record(payload, signature, bytes.fromhex(public_key))
    if facts.tenant != check.tenant:
        raise LedgerInvalid(f"a record of tenant {facts.tenant!r}")
    if (public_key, facts.request_id) in seen:
        raise LedgerInvalid("a second row of the same worker and request (counted once)")
    seen.add((public_key, facts.request_id))
    total = check.totals.setdefault(facts.key_id, {"requests": 0, "prompt_tokens": 0, "completion_tokens": 0,
                                                   "worker_seconds": 0.0})
    total["requests"] += 1
    total["prompt_tokens"] += facts.prompt_tokens
    total["completion_tokens"] += facts.completion_tokens
    total["worker_seconds"] += facts.worker_seconds
    stored = record.get("stored")
    if isinstance(stored, Mapping):
        edited = [f for f in _COMPARED if f in stored and stored[f] != getattr(facts, f)]
        if edited:  # counted as signed; the control plane's row says otherwise
            raise LedgerInvalid(f"the control plane's row differs from the signed record ({', '.join(edited)}); "
                                "counted as signed")
