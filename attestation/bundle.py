"""The evidence bundle a worker presents, and the REPORT_DATA binding of its runtime data.

REPORT_DATA = SHA-512(domain || nonce || HPKE public key || len || channel binding || SHA-384(GPU
evidence) [|| u32 len || workload claims]), so the CPU report vouches for the freshness nonce, the
key that release will be sealed to, the worker's channel keys (its mTLS certificate key and
usage-signing key), the exact GPU evidence collected with the same nonce, and what the worker says
it serves and promises (tenant, model, version, model digest, promises).
"""

from __future__ import annotations

import base64
import hashlib
from dataclasses import dataclass, field
from typing import Any

from attestation.errors import FreshnessError, ParseError
from protocol.broker.evidence import MAX_WORKLOAD_BYTES, NONCE_BYTES, RuntimeData  # the key-release protocol's inputs

_BINDING_DOMAIN = b"sealed-report-data-v1\x00"

__all__ = ["MAX_WORKLOAD_BYTES", "NONCE_BYTES", "EvidenceBundle", "GpuEvidence", "RuntimeData", "channel_binding",
           "check_binding", "expected_report_data", "gpu_evidence_digest"]


def channel_binding(tls_spki_der: bytes, usage_public_key: bytes) -> bytes:
    """What a gateway checks before routing to a worker: its mTLS key and usage-signing key are the
    ones this attestation covers."""
    return hashlib.sha256(b"sealed-channel-v1\x00" + len(tls_spki_der).to_bytes(4, "big") + tls_spki_der
                          + usage_public_key).digest()


@dataclass(frozen=True)
class GpuEvidence:
    arch: str  # "hopper"
    evidence: bytes  # SPDM GET_MEASUREMENTS request || response
    certificate_chain: bytes  # PEM

    def to_json(self) -> dict[str, str]:
        return {
            "arch": self.arch,
            "evidence": base64.b64encode(self.evidence).decode(),
            "certificate_chain": self.certificate_chain.decode(),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> GpuEvidence:
        try:
            return cls(
                arch=str(data["arch"]),
                evidence=base64.b64decode(data["evidence"], validate=True),
                certificate_chain=str(data["certificate_chain"]).encode(),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ParseError(f"malformed GPU evidence: {exc}") from exc


@dataclass(frozen=True)
class EvidenceBundle:
    tee: str  # "snp" | "tdx" | "sim"
    cpu_evidence: bytes
    runtime_data: RuntimeData
    cpu_certificates: tuple[bytes, ...] = ()
    gpus: tuple[GpuEvidence, ...] = field(default_factory=tuple)
    # TDX: the CC event log (ACPI CCEL); the verifier replays it to the quote's RTMRs. Not bound
    # into REPORT_DATA: the RTMRs it must reproduce are inside the signed quote.
    event_log: bytes = b""

    def to_json(self) -> dict[str, Any]:
        return {
            "tee": self.tee,
            "cpu_evidence": base64.b64encode(self.cpu_evidence).decode(),
            "cpu_certificates": [base64.b64encode(c).decode() for c in self.cpu_certificates],
            "runtime_data": {
                "nonce": self.runtime_data.nonce.hex(),
                "hpke_public_key": self.runtime_data.hpke_public_key.hex(),
                "channel_binding": self.runtime_data.channel_binding.hex(),
                **({"workload": self.runtime_data.workload.hex()} if self.runtime_data.workload else {}),
            },
            "gpus": [g.to_json() for g in self.gpus],
            **({"event_log": base64.b64encode(self.event_log).decode()} if self.event_log else {}),
        }

    @classmethod
    def from_json(cls, data: Any) -> EvidenceBundle:
        if not isinstance(data, dict):
            raise ParseError("evidence bundle must be a JSON object")
        try:
            rd = data["runtime_data"]
            return cls(
                tee=str(data["tee"]),
                cpu_evidence=base64.b64decode(data["cpu_evidence"], validate=True),
                cpu_certificates=tuple(base64.b64decode(c, validate=True) for c in data.get("cpu_certificates", [])),
                runtime_data=RuntimeData(
                    nonce=bytes.fromhex(rd["nonce"]), hpke_public_key=bytes.fromhex(rd["hpke_public_key"]),
                    channel_binding=bytes.fromhex(rd.get("channel_binding", "")),
                    workload=bytes.fromhex(rd.get("workload", "")),
                ),
                gpus=tuple(GpuEvidence.from_json(g) for g in data.get("gpus", [])),
                event_log=base64.b64decode(data.get("event_log", ""), validate=True),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ParseError(f"malformed evidence bundle: {exc}") from exc

    def digest(self) -> str:
        """Stable digest for audit records (the evidence itself is never logged)."""
        h = hashlib.sha256(self.cpu_evidence)
        for gpu in self.gpus:
            h.update(gpu.evidence)
        if self.event_log:
            h.update(b"event-log" + self.event_log)
        rd = self.runtime_data
        h.update(rd.nonce + rd.hpke_public_key + rd.channel_binding)
        if rd.workload:
            h.update(b"workload" + rd.workload)
        return h.hexdigest()


def gpu_evidence_digest(gpus: tuple[GpuEvidence, ...]) -> bytes:
    h = hashlib.sha384()
    for gpu in gpus:
        h.update(len(gpu.evidence).to_bytes(4, "big") + gpu.evidence)
    return h.digest()


def expected_report_data(runtime: RuntimeData, gpus: tuple[GpuEvidence, ...]) -> bytes:
    # The workload claims come last, length-prefixed and only when present (every field before
    # them has a fixed or prefixed length), so evidence without them keeps its REPORT_DATA.
    workload = len(runtime.workload).to_bytes(4, "big") + runtime.workload if runtime.workload else b""
    return hashlib.sha512(
        _BINDING_DOMAIN + runtime.nonce + runtime.hpke_public_key
        + bytes([len(runtime.channel_binding)]) + runtime.channel_binding + gpu_evidence_digest(gpus) + workload
    ).digest()


def check_binding(report_data: bytes, bundle: EvidenceBundle) -> None:
    """The CPU report's REPORT_DATA must commit to exactly this bundle's runtime data."""
    if report_data != expected_report_data(bundle.runtime_data, bundle.gpus):
        raise FreshnessError("REPORT_DATA does not bind the runtime data (nonce, HPKE key, GPU evidence)")
