"""What the key-release protocol hands the attester, and what it needs back.

`RuntimeData` is the protocol's side of the binding: the broker's fresh nonce, the HPKE key the
data key will be sealed to, and the worker's channel keys. The attester (`enclave_worker`) turns
it into evidence and the verifier (`attestation.bundle`) checks the evidence commits to it. The
client here only sends the evidence: `Evidence` is the one thing it asks of it.

Layering: `attestation` builds on `protocol` (it reads this type); `protocol` imports no other
project package, so the evidence bundle's format and checks stay in `attestation.bundle`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

NONCE_BYTES = 32
MAX_WORKLOAD_BYTES = 4096


class InvalidRuntimeData(ValueError):
    """A nonce, HPKE key, channel binding or workload claims of the wrong length."""


@dataclass(frozen=True)
class RuntimeData:
    nonce: bytes
    hpke_public_key: bytes  # raw X25519 public key of the worker's ephemeral key pair
    channel_binding: bytes = b""  # attestation.bundle.channel_binding(): TLS and usage keys; empty if none
    # The worker's workload claims (attestation.workload): what it is configured to serve and promise
    # (canonical JSON), so a client reads tenant, model and promises from what the hardware signed.
    workload: bytes = b""

    def __post_init__(self) -> None:
        if len(self.nonce) != NONCE_BYTES:
            raise InvalidRuntimeData(f"nonce must be {NONCE_BYTES} bytes, got {len(self.nonce)}")
        if len(self.hpke_public_key) != 32:
            raise InvalidRuntimeData("HPKE public key must be a 32-byte X25519 key")
        if len(self.channel_binding) not in (0, 32):
            raise InvalidRuntimeData("channel binding must be empty or 32 bytes")
        if len(self.workload) > MAX_WORKLOAD_BYTES:
            raise InvalidRuntimeData(f"workload claims must be at most {MAX_WORKLOAD_BYTES} bytes")


class Evidence(Protocol):
    """Evidence as the client sends it (`attestation.bundle.EvidenceBundle` is one)."""

    def to_json(self) -> dict[str, Any]: ...
