"""Tamper-evident audit log: hash-chained, signed entries, signed Merkle checkpoints."""

from policy.audit.anchor import CheckpointAnchor, SqlAnchor, WitnessFile
from policy.audit.checkpoint import Checkpoint, checkpoint_path, latest_checkpoint, read_checkpoints
from policy.audit.entry import AuditEntry
from policy.audit.log import AuditLog
from policy.audit.query import auditor_entries, export_jsonl, read_dir, read_entries, write_jsonl
from policy.audit.verify import (
    AuditVerifyReport,
    entry_hashes,
    log_files,
    prove_inclusion,
    verify_dir,
    verify_log,
)

__all__ = [
    "AuditEntry", "AuditLog", "AuditVerifyReport", "Checkpoint", "CheckpointAnchor", "SqlAnchor", "WitnessFile",
    "auditor_entries", "checkpoint_path",
    "entry_hashes", "export_jsonl", "latest_checkpoint", "log_files", "prove_inclusion",
    "read_checkpoints", "read_dir", "read_entries", "verify_dir", "verify_log", "write_jsonl",
]
