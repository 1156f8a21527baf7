"""Sealing: state encrypted under a key only this measured workload on this platform can derive.

A `SealingKeySource` is the TEE's key-derivation service, bound to the caller's measurement:

* simulated TEE (`attestation.sim.sealing.SimSealingKey`): HKDF over the simulated platform key
  and the measurement. The platform key is a file on the operator's disk, so this protects nothing
  against the operator; it keeps the shape (a changed workload cannot open its predecessor's state).
* SEV-SNP (`attestation.snp.derived_key.SnpDerivedKey`): the firmware's MSG_KEY_REQ through
  /dev/sev-guest (SNP_GET_DERIVED_KEY), rooted in the chip's VCEK secret and mixing in the launch
  measurement and guest policy: the host never sees it.
* TDX has no firmware sealing key; docs/security.md ("The key broker is a confidential workload")
  writes the chosen design down (state key released by an attested key service, dstack-style).

`seal`/`unseal` are AES-256-GCM under a key derived for a label; the associated data names the TEE
and measurement the blob was sealed to, so a blob is refused (`SealingError`) anywhere else.
"""

from __future__ import annotations

import base64
import json
import secrets
from dataclasses import dataclass
from typing import Any, Protocol

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from attestation.errors import SealingError

SEALED_FORMAT = "sealed-state-v1"


class SealingKeySource(Protocol):
    tee: str
    measurement: bytes

    def derive(self, label: bytes) -> bytes:
        """32 bytes only this measurement on this platform obtains for `label`."""
        ...


@dataclass(frozen=True)
class SealedBlob:
    tee: str
    measurement: str  # hex: which workload sealed it (a later build cannot open it)
    label: str
    nonce: bytes
    ciphertext: bytes

    def to_json(self) -> dict[str, Any]:
        return {"format": SEALED_FORMAT, "tee": self.tee, "measurement": self.measurement, "label": self.label,
                "nonce": base64.b64encode(self.nonce).decode(),
                "ciphertext": base64.b64encode(self.ciphertext).decode()}

    @classmethod
    def from_bytes(cls, raw: bytes) -> SealedBlob:
        try:
            doc = json.loads(raw)
            if doc.get("format") != SEALED_FORMAT:
                raise ValueError("unknown format")
            return cls(str(doc["tee"]), str(doc["measurement"]), str(doc["label"]),
                       base64.b64decode(doc["nonce"], validate=True),
                       base64.b64decode(doc["ciphertext"], validate=True))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise SealingError(f"sealed state is malformed: {type(exc).__name__}") from exc


def _aad(tee: str, measurement: str, label: str) -> bytes:
    return f"{SEALED_FORMAT}|{tee}|{measurement}|{label}".encode()


def seal(source: SealingKeySource, label: str, plaintext: bytes) -> bytes:
    measurement = source.measurement.hex()
    nonce = secrets.token_bytes(12)
    ct = AESGCM(source.derive(label.encode())).encrypt(nonce, plaintext, _aad(source.tee, measurement, label))
    return json.dumps(SealedBlob(source.tee, measurement, label, nonce, ct).to_json(), sort_keys=True).encode()


def unseal(source: SealingKeySource, label: str, raw: bytes) -> bytes:
    blob = SealedBlob.from_bytes(raw)
    if blob.label != label:
        raise SealingError(f"sealed state is for {blob.label!r}, not {label!r}")
    if (blob.tee, blob.measurement) != (source.tee, source.measurement.hex()):
        raise SealingError(f"state sealed to another workload ({blob.tee}, measurement {blob.measurement[:16]}...), "
                           f"not this one ({source.tee}, {source.measurement.hex()[:16]}...)")
    try:
        return AESGCM(source.derive(label.encode())).decrypt(blob.nonce, blob.ciphertext,
                                                             _aad(blob.tee, blob.measurement, label))
    except InvalidTag as exc:
        raise SealingError("sealed state does not open on this platform (another platform key, or edited)") from exc
