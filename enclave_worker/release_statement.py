"""What this worker tells clients about its key release: the tenant-signed release policy it got its
key under, signed with its receipt (usage) key, which its evidence binds (protocol/sealed/release_statement.py).

Only a policy this worker checked itself (release_policy_check.py, with the policy-admin key its
measurement pins) is stated; without one nothing is, and a client that pins the tenant refuses it.
"""

from __future__ import annotations

from typing import Any

from protocol.sealed.release_statement import ReleaseStatement, payload_sha256, sign_release_statement


def release_statement(state: Any) -> dict[str, Any] | None:
    """The signed statement for `state.booted` (enclave_worker.state.WorkerState), or None."""
    booted = state.booted
    policy = getattr(booted, "release_policy", None)
    envelope = getattr(getattr(booted, "released", None), "release_policy", None)
    if booted is None or policy is None or not isinstance(envelope, dict):
        return None
    s = state.settings
    statement = ReleaseStatement(
        tenant=s.tenant, model=s.model, version=s.version, worker_key_id=state.serving_key.key_id,
        release_policy_id=policy.policy_id, release_policy_version=policy.version,
        release_policy_sha256=payload_sha256(envelope), admin_key_id=str(envelope.get("key_id", "")),
        data_key_id=booted.decrypted.manifest.key_id)
    return sign_release_statement(statement, envelope, state.usage_key)
