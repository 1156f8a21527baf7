"""Plain functions behind ``sealed audit ...`` and ``sealed policy ...`` (the lead wires typer).

Key files: public keys are PEM files named ``<component>.pub`` (audit) or
``<tenant>/<key_id>.pub`` (policy admins) in the given directory.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Any, TextIO

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import load_pem_private_key, load_pem_public_key

from policy.audit import AuditVerifyReport, auditor_entries, log_files, verify_log, write_jsonl
from policy.documents import sign_policy_document, verify_policy_document
from policy.errors import PolicyInvalid
from policy.policyset import PolicySet


def load_public_keys(keys_dir: Path) -> dict[str, Ed25519PublicKey]:
    """``<name>.pub`` PEM files -> {name: key}."""
    keys: dict[str, Ed25519PublicKey] = {}
    for path in sorted(Path(keys_dir).glob("*.pub")):
        key = load_pem_public_key(path.read_bytes())
        if not isinstance(key, Ed25519PublicKey):
            raise PolicyInvalid(f"{path} is not an Ed25519 public key")
        keys[path.stem] = key
    return keys


def load_private_key(path: Path) -> Ed25519PrivateKey:
    key = load_pem_private_key(Path(path).read_bytes(), None)
    if not isinstance(key, Ed25519PrivateKey):
        raise PolicyInvalid(f"{path} is not an Ed25519 private key")
    return key


def audit_verify(dir_or_file: Path, keys_dir: Path) -> list[AuditVerifyReport]:
    """Verify one log or every log in a directory; raises AuditIntegrityError on the first bad one."""
    target = Path(dir_or_file)
    keys = load_public_keys(keys_dir)
    files = log_files(target) if target.is_dir() else [target]
    return [verify_log(f, keys) for f in files]


def audit_export(directory: Path, tenant: str, since: datetime | None = None, fmt: str = "jsonl",
                 out: Path | TextIO | None = None, *, component: str | None = None,
                 decision: str | None = None) -> int:
    """Export one tenant's entries (never another tenant's) as JSONL; returns the count written."""
    if fmt != "jsonl":
        raise ValueError("only jsonl export is supported")
    entries = auditor_entries(Path(directory), tenant, since=since, component=component, decision=decision)
    if out is None:
        return write_jsonl(entries, sys.stdout)
    if isinstance(out, Path | str):
        with open(out, "w", encoding="ascii") as fh:
            return write_jsonl(entries, fh)
    return write_jsonl(entries, out)


def policy_sign(policy_file: Path, admin_key_file: Path, key_id: str, out: Path) -> dict[str, Any]:
    """Sign a policy set JSON file with a tenant admin key; writes and returns the envelope."""
    envelope = sign_policy_document(json.loads(Path(policy_file).read_text()),
                                    load_private_key(admin_key_file), key_id)
    Path(out).write_text(json.dumps(envelope, indent=2, sort_keys=True) + "\n")
    return envelope


def load_admin_keys(admin_keys_dir: Path) -> Mapping[str, Mapping[str, Ed25519PublicKey]]:
    """``<tenant>/<key_id>.pub`` -> {tenant: {key_id: key}}."""
    root = Path(admin_keys_dir)
    return {d.name: load_public_keys(d) for d in sorted(root.iterdir()) if d.is_dir()}


def policy_validate(envelope_file: Path, admin_keys_dir: Path) -> PolicySet:
    """Verify the signature and validate an uploaded policy envelope; raises PolicyInvalid."""
    try:
        envelope = json.loads(Path(envelope_file).read_text())
    except ValueError as exc:
        raise PolicyInvalid(f"{envelope_file} is not JSON") from exc
    return verify_policy_document(envelope, load_admin_keys(admin_keys_dir))
