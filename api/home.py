"""The on-disk layout of a one-machine deployment ($SEALED_HOME, default ~/.sealed)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from protocol.fsutil import atomic_write
from protocol.keyfile import load_or_create_private_key


def default_home() -> Path:
    return Path(os.environ.get("SEALED_HOME") or Path.home() / ".sealed")


@dataclass(frozen=True)
class Home:
    root: Path

    @property
    def reference_values(self) -> Path:
        """The operator's signed reference values (in-toto statement), served by the gateway."""
        return self.root / "gateway" / "reference-values.json"

    @property
    def broker(self) -> Path:
        return self.root / "broker"

    @property
    def gateway(self) -> Path:
        return self.root / "gateway"

    @property
    def audit(self) -> Path:
        return self.root / "audit"

    @property
    def audit_witness(self) -> Path:
        """Signed audit checkpoints of every component, outside the audit directory, so that
        deleting or truncating a log together with its `.ckpt` file is still detected (one host:
        same disk, a different directory; copy it elsewhere with `sealed audit witness`)."""
        return self.root / "witness" / "audit-checkpoints.jsonl"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def sim_key(self) -> Path:
        return self.root / "sim" / "platform.pem"

    @property
    def sim_public_key(self) -> Path:
        return self.root / "sim" / "platform.pub.pem"

    def tenant_signing_key(self, tenant: str) -> Path:
        return self.root / "tenants" / tenant / "signing.pem"

    def tenant_policy_admin(self, tenant: str) -> Path:
        return self.root / "tenants" / tenant / "policy-admin.pem"

    def tenant_policy_admin_public(self, tenant: str) -> Path:
        return self.root / "tenants" / tenant / "policy-admin.pub.pem"

    def tenant_decision_record_key(self, tenant: str) -> Path:
        """The tenant's X25519 private key that opens workers' sealed decision records (its public
        half is in the signed policy set): a tenant's file, like everything under tenants/<tenant>/."""
        return self.root / "tenants" / tenant / "decision-record.pem"

    def tenant_policy(self, tenant: str) -> Path:
        return self.root / "tenants" / tenant / "policy.json"

    def api_key_file(self, tenant: str) -> Path:
        return self.root / tenant / "api-key"

    def package(self, tenant: str, model: str, version: str) -> Path:
        return self.root / "packages" / tenant / model / version

    def create(self) -> None:
        for d in (self.root, self.broker, self.gateway, self.audit, self.logs):
            d.mkdir(parents=True, exist_ok=True, mode=0o700)


def ed25519_key(path: Path) -> Ed25519PrivateKey:
    """Load or create (0600) an Ed25519 private key in PEM."""
    return load_or_create_private_key(path, Ed25519PrivateKey, Ed25519PrivateKey.generate)


def x25519_key(path: Path) -> X25519PrivateKey:
    """Load or create (0600) an X25519 private key in PEM."""
    if path.exists():
        key = serialization.load_pem_private_key(path.read_bytes(), password=None)
        if not isinstance(key, X25519PrivateKey):
            raise ValueError(f"{path} is not an X25519 key")
        return key
    created = X25519PrivateKey.generate()
    atomic_write(path, created.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                             serialization.NoEncryption()))
    return created


def write_public_key(key: Ed25519PrivateKey, path: Path) -> None:
    atomic_write(path, key.public_key().public_bytes(serialization.Encoding.PEM,
                                                     serialization.PublicFormat.SubjectPublicKeyInfo), mode=0o644)
