"""The broker's attested self: its identity document and fresh evidence that binds it.

`POST /v1/broker/attestation {"nonce"}` answers `BrokerSelf.attest(nonce)`: the identity document
(protocol/broker/identity.py) and an evidence bundle from the broker's own TEE whose REPORT_DATA
binds the caller's nonce and the document's digest. Workers verify it before they trust a token, a
receipt or a lease answer; tenants and clients with `sealed verify --broker`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from key_broker.measurement import measured_config
from key_broker.platform import BrokerPlatform
from key_broker.sealed_keys import BrokerKeys
from key_broker.settings import BrokerSettings
from protocol.broker.identity import BrokerIdentity, broker_runtime_data


def _raw(public: Any) -> bytes:
    raw: bytes = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return raw


@dataclass(frozen=True)
class BrokerSelf:
    platform: BrokerPlatform
    identity: BrokerIdentity
    instance_key: Ed25519PrivateKey = field(repr=False)  # signs invitations and governing-key answers

    def attest(self, nonce: bytes) -> dict[str, Any]:
        bundle = self.platform.attester.bundle(broker_runtime_data(self.identity, nonce))
        return {"identity": self.identity.to_json(), "evidence": bundle.to_json()}


def instance_id(public: Any) -> str:
    """The broker instance's id: its instance public key (hex), as its identity document names it."""
    return _raw(public).hex()


def broker_self(settings: BrokerSettings, platform: BrokerPlatform, keys: BrokerKeys,
                token_jwks: dict[str, Any]) -> BrokerSelf:
    identity = BrokerIdentity(issuer=settings.issuer, tee=platform.tee, measured_config=measured_config(settings),
                              token_jwks=token_jwks, receipt_key=_raw(keys.receipt_key.public_key()),
                              import_key=_raw(keys.import_key.public_key()),
                              instance_key=_raw(keys.instance_key.public_key()))
    return BrokerSelf(platform, identity, keys.instance_key)
