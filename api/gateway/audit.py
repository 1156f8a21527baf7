"""The gateway's audit log: admission refusals, management actions (api/management/audit.py), and
the workers' signed in-enclave decisions, in the shared audit directory beside the key broker's (one
trail, one format: docs/policy.md "Audit log"). Decisions and identifiers only, never prompts, completions or keys."""

from __future__ import annotations

import hashlib
import logging
import os
import secrets

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from api.gateway.settings import GatewaySettings
from policy.audit import AuditLog, CheckpointAnchor, SqlAnchor, WitnessFile
from policy.audit.worker_record import DecisionRecordError, logged_metadata, verify_decision
from protocol.keyfile import load_or_create_private_key
from protocol.rpc import worker_pb2

log = logging.getLogger(__name__)
COMPONENT = "gateway"


def open_gateway_audit(settings: GatewaySettings) -> AuditLog:
    """This replica's log. One writer per file and one key per component name: a second replica on
    the same directory gets its own component name (``gateway-<pid>-<rand>``), and so does a key
    other than the one published for ``gateway`` (``gateway-<key digest>``); each public key is in
    ``keys/``. In fleet mode
    (a PostgreSQL control plane) every checkpoint is also anchored in that database."""
    audit_dir = settings.audit_dir or settings.data_dir.resolve().parent / "audit"
    key = load_or_create_private_key(settings.data_dir / "audit-signing.pem", Ed25519PrivateKey,
                                     Ed25519PrivateKey.generate)
    anchors: list[CheckpointAnchor] = []
    if settings.db_url.startswith("postgresql"):
        anchors.append(SqlAnchor(settings.db_url))
    if settings.console.audit_witness is not None:  # the witness the console checks logs against
        anchors.append(WitnessFile(settings.console.audit_witness))
    public = key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    # A log whose published key is another one (another gateway's, or an earlier key) is never
    # appended to under this key: that would make its earlier entries fail verification.
    published = audit_dir / "keys" / f"{COMPONENT}.pem"
    component = COMPONENT
    if published.exists() and published.read_bytes() != public:
        component = f"{COMPONENT}-{hashlib.sha256(public).hexdigest()[:8]}"
    for _ in range(3):
        try:
            audit = AuditLog(audit_dir / f"{component}.audit.jsonl", key, component, anchors=anchors)
            break
        except BlockingIOError:  # another replica writes that file
            component = f"{COMPONENT}-{os.getpid()}-{secrets.token_hex(2)}"
    else:
        raise RuntimeError("no free gateway audit log name")
    (audit_dir / "keys").mkdir(parents=True, exist_ok=True)
    (audit_dir / "keys" / f"{component}.pem").write_bytes(public)
    return audit


def audit_worker_decisions(audit: AuditLog, records: list[worker_pb2.UsageRecord], *, pinned_key_hex: str,
                           request_id: str, tenant: str, worker_id: str) -> int:
    """Verify each signed in-enclave decision of a plaintext request against the worker's attested
    key and append it. A record that does not verify, or names another request or tenant, is itself
    audited as refused (a worker or a path in between misbehaves); returns how many were appended
    as valid. A sealed request's decisions never come here: they are in the tenant's sealed record
    (`settlement.py`)."""
    appended = 0
    for record in records:
        try:
            if record.public_key.hex() != pinned_key_hex:
                raise DecisionRecordError("signed by a key other than the worker's attested one")
            fields = verify_decision(record.payload, record.signature, record.public_key)
            if fields["request_id"] != request_id[:128] or fields["tenant"] != tenant[:128]:
                raise DecisionRecordError("record names another request or tenant")
        except DecisionRecordError as exc:
            log.error("worker %s sent an invalid decision record: %s", worker_id, exc)
            audit.append(tenant=tenant, action="worker-decision-invalid", decision="deny", reason=str(exc),
                         metadata={"worker_id": worker_id[:64], "request_id": request_id[:128]})
            continue
        audit.append(tenant=fields["tenant"], action="worker-decision", decision=fields["decision"],
                     reason=f"{fields['action']}: rule {fields['rule']}",
                     metadata={**logged_metadata(fields, record.signature, record.public_key),
                               "worker_id": worker_id[:64]})
        appended += 1
    return appended

