"""The simulated TEE's sealing key: HKDF over the simulated platform key and the measurement.

Insecure by construction: whoever holds the simulated platform key (a file on the operator's disk)
derives every sealing key. It gives the shape of a real sealing key (another measurement, another
platform: another key), nothing more; docs/security.md says so.
"""

from __future__ import annotations

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

_INFO = b"sealed-sim-sealing-key-v1\x00"


class SimSealingKey:
    tee = "sim"

    def __init__(self, platform_key: Ed25519PrivateKey, measurement: bytes) -> None:
        if len(measurement) != 48:
            raise ValueError("measurement must be 48 bytes")
        self._secret = platform_key.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
                                                  serialization.NoEncryption())
        self.measurement = measurement

    def derive(self, label: bytes) -> bytes:
        return HKDF(algorithm=hashes.SHA256(), length=32, salt=self.measurement,
                    info=_INFO + label).derive(self._secret)
