"""The key broker's identity document, and how its evidence binds it (shared by broker, worker, client).

The broker answers `POST /v1/broker/attestation {"nonce": hex}` with its identity document (issuer,
TEE, measured configuration, and the public halves of the keys it generated inside its TEE: token
JWKS, receipt key, import key, instance key) and an evidence bundle (`attestation.bundle.EvidenceBundle`, the
worker's format: sim, SNP or TDX) whose runtime data is `broker_runtime_data(identity, nonce)`:

    nonce            = the caller's nonce (32 bytes)
    hpke_public_key  = the broker's X25519 import key
    channel_binding  = identity_digest(identity) = SHA-256("sealed-broker-identity-v1\\0" || canonical JSON)

so REPORT_DATA (attestation.bundle.expected_report_data, SHA-512 over those) commits the hardware's
signature to exactly this identity document and this caller's nonce. A verifier recomputes the
runtime data from the document it received; it never takes it from the bundle.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from pydantic import Field

from protocol.broker.errors import BrokerClientError
from protocol.broker.evidence import NONCE_BYTES, RuntimeData
from protocol.broker.schemas import Strict

IDENTITY_FORMAT = "sealed-broker-identity-v1"
_DOMAIN = IDENTITY_FORMAT.encode() + b"\x00"


class BrokerIdentityInvalid(BrokerClientError):
    """A broker identity document is malformed."""


def canonical(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


@dataclass(frozen=True)
class BrokerIdentity:
    issuer: str
    tee: str
    measured_config: dict[str, Any]
    token_jwks: dict[str, Any]
    receipt_key: bytes  # raw Ed25519 public key: signs release receipts (and the broker's audit log)
    import_key: bytes  # raw X25519 public key: tenants seal data keys to it
    # raw Ed25519 public key made at the broker's initialisation: which broker instance this is (a fresh
    # or second broker has another; workers and tenants pin it). It signs tenant invitations and the
    # answer of which policy-admin key governs a tenant (protocol/broker/tenancy.py).
    instance_key: bytes

    def to_json(self) -> dict[str, Any]:
        return {"format": IDENTITY_FORMAT, "issuer": self.issuer, "tee": self.tee,
                "measured_config": self.measured_config, "token_jwks": self.token_jwks,
                "receipt_key": self.receipt_key.hex(), "import_key": self.import_key.hex(),
                "instance_key": self.instance_key.hex()}

    @classmethod
    def from_json(cls, doc: Any) -> BrokerIdentity:
        fields = {"format", "issuer", "tee", "measured_config", "token_jwks", "receipt_key", "import_key",
                  "instance_key"}
        if not isinstance(doc, dict) or set(doc) != fields or doc["format"] != IDENTITY_FORMAT:
            raise BrokerIdentityInvalid("not a broker identity document")
        try:
            identity = cls(str(doc["issuer"]), str(doc["tee"]), dict(doc["measured_config"]),
                           dict(doc["token_jwks"]), bytes.fromhex(doc["receipt_key"]), bytes.fromhex(doc["import_key"]),
                           bytes.fromhex(doc["instance_key"]))
        except (TypeError, ValueError) as exc:
            raise BrokerIdentityInvalid(f"malformed broker identity document: {type(exc).__name__}") from exc
        if len(identity.receipt_key) != 32 or len(identity.import_key) != 32 or len(identity.instance_key) != 32:
            raise BrokerIdentityInvalid("broker identity keys must be 32-byte raw public keys")
        return identity

    def encode(self) -> bytes:
        return canonical(self.to_json())

    def digest(self) -> bytes:
        return identity_digest(self)

    @property
    def instance_id(self) -> str:
        """Which broker instance this is (hex of the instance key): pinned by workers and tenants."""
        return self.instance_key.hex()


def identity_digest(identity: BrokerIdentity) -> bytes:
    return hashlib.sha256(_DOMAIN + identity.encode()).digest()


def broker_runtime_data(identity: BrokerIdentity, nonce: bytes) -> RuntimeData:
    """What the broker's evidence binds: the caller's nonce, its import key, its identity digest."""
    return RuntimeData(nonce=nonce, hpke_public_key=identity.import_key, channel_binding=identity_digest(identity))


class BrokerAttestationRequest(Strict):
    nonce: str = Field(min_length=2 * NONCE_BYTES, max_length=2 * NONCE_BYTES, pattern=r"^[0-9a-f]+$")


class BrokerAttestationResponse(Strict):
    identity: dict[str, Any]
    evidence: dict[str, Any]
