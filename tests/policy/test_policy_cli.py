"""CLI helper functions: audit verify/export, policy sign/validate with key files."""

from __future__ import annotations

import io
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from policy import AuditIntegrityError, PolicyInvalid
from policy.audit import AuditLog
from policy.cli import audit_export, audit_verify, policy_sign, policy_validate


def _pem_pub(key: Ed25519PrivateKey) -> bytes:
    return key.public_key().public_bytes(serialization.Encoding.PEM,
                                         serialization.PublicFormat.SubjectPublicKeyInfo)


def _pem_priv(key: Ed25519PrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


@pytest.fixture
def audit_dir(tmp_path: Path) -> tuple[Path, Path]:
    logs, keys = tmp_path / "audit", tmp_path / "keys"
    keys.mkdir()
    t0 = datetime(2026, 3, 1, tzinfo=UTC)
    for n, comp in enumerate(("gateway", "key_broker")):
        key = Ed25519PrivateKey.generate()
        (keys / f"{comp}.pub").write_bytes(_pem_pub(key))
        ticks = iter(t0 + timedelta(hours=i + n) for i in range(10))
        with AuditLog(logs / f"{comp}.audit.jsonl", key, comp, clock=lambda t=ticks: next(t)) as log:
            for i in range(4):
                log.append(tenant=("acme", "globex")[i % 2], action=comp, decision="allow")
    return logs, keys


def test_audit_verify_dir_and_file(audit_dir: tuple[Path, Path]) -> None:
    logs, keys = audit_dir
    reports = audit_verify(logs, keys)
    assert [r.entries for r in reports] == [4, 4]
    assert audit_verify(logs / "gateway.audit.jsonl", keys)[0].component == "gateway"
    (keys / "gateway.pub").write_bytes(_pem_pub(Ed25519PrivateKey.generate()))
    with pytest.raises(AuditIntegrityError):
        audit_verify(logs, keys)


def test_audit_export(audit_dir: tuple[Path, Path], tmp_path: Path) -> None:
    logs, _ = audit_dir
    out = tmp_path / "acme.jsonl"
    assert audit_export(logs, "acme", None, "jsonl", out) == 4
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert {r["tenant"] for r in rows} == {"acme"}
    buf = io.StringIO()
    since = datetime(2026, 3, 1, 2, tzinfo=UTC)
    n = audit_export(logs, "acme", since, "jsonl", buf, component="key_broker")
    assert n == len(buf.getvalue().splitlines()) == 1
    with pytest.raises(ValueError):
        audit_export(logs, "acme", None, "csv", buf)


def test_policy_sign_and_validate(tmp_path: Path) -> None:
    admin = Ed25519PrivateKey.generate()
    (tmp_path / "admin.pem").write_bytes(_pem_priv(admin))
    (tmp_path / "admins" / "acme").mkdir(parents=True)
    (tmp_path / "admins" / "acme" / "admin-1.pub").write_bytes(_pem_pub(admin))
    (tmp_path / "policy.json").write_text(json.dumps({"policy_id": "p", "version": 1, "tenant": "acme"}))
    policy_sign(tmp_path / "policy.json", tmp_path / "admin.pem", "admin-1", tmp_path / "signed.json")
    assert policy_validate(tmp_path / "signed.json", tmp_path / "admins").policy_id == "p"
    signed = json.loads((tmp_path / "signed.json").read_text())
    signed["payload"]["version"] = 2
    (tmp_path / "signed.json").write_text(json.dumps(signed))
    with pytest.raises(PolicyInvalid):
        policy_validate(tmp_path / "signed.json", tmp_path / "admins")
