"""Simulated TEE evidence: a JSON report signed by a local Ed25519 "platform" key.

The measurement is computed over the worker's own code and configuration, so a changed worker
gets a different measurement, as with a real launch digest. None of this resists an operator with
root on the host: the platform key is a file. Verifiers mark every claim from it `insecure`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from attestation.errors import ParseError, SignatureError

SIM_REPORT_VERSION = 1
_SIG_BYTES = 64


@dataclass(frozen=True)
class SimReport:
    version: int
    measurement: bytes  # 48 bytes, like an SNP launch measurement
    report_data: bytes  # 64 bytes
    debug: bool
    tcb: dict[str, int]


def worker_measurement(code: Mapping[str, bytes], config: Mapping[str, Any]) -> bytes:
    """SHA-384 over the worker's source files (relative path -> bytes, in path order) and the
    canonical config. Which files are the worker's code is the worker's to say
    (`enclave_worker.measurement`)."""
    h = hashlib.sha384(b"sealed-sim-measurement-v1\x00")
    for rel_path in sorted(code):
        rel = rel_path.encode()
        data = code[rel_path]
        h.update(len(rel).to_bytes(4, "big") + rel + len(data).to_bytes(8, "big") + data)
    h.update(json.dumps(dict(config), sort_keys=True, separators=(",", ":")).encode())
    return h.digest()


class SimTee:
    """The attester side: signs reports with the local platform key."""

    def __init__(self, platform_key: Ed25519PrivateKey, measurement: bytes) -> None:
        if len(measurement) != 48:
            raise ValueError("measurement must be 48 bytes")
        self._key = platform_key
        self._measurement = measurement

    def get_report(self, report_data: bytes) -> bytes:
        if len(report_data) != 64:
            raise ValueError("report_data must be 64 bytes")
        body = json.dumps(
            {
                "version": SIM_REPORT_VERSION,
                "tee": "sim",
                "measurement": self._measurement.hex(),
                "report_data": report_data.hex(),
                "debug": False,
                "tcb": {"sim": 1},
            },
            sort_keys=True,
            separators=(",", ":"),
        ).encode()
        return body + self._key.sign(body)


def parse_sim_report(raw: bytes) -> SimReport:
    if len(raw) <= _SIG_BYTES or len(raw) > 4096:
        raise ParseError("simulated report has an invalid length")
    try:
        doc = json.loads(raw[:-_SIG_BYTES])
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ParseError(f"simulated report is not JSON: {exc}") from exc
    if not isinstance(doc, dict) or set(doc) != {"version", "tee", "measurement", "report_data", "debug", "tcb"}:
        raise ParseError("simulated report has unexpected fields")
    if doc["version"] != SIM_REPORT_VERSION or doc["tee"] != "sim":
        raise ParseError("unsupported simulated report version")
    try:
        measurement = bytes.fromhex(doc["measurement"])
        report_data = bytes.fromhex(doc["report_data"])
        tcb = {str(k): int(v) for k, v in dict(doc["tcb"]).items()}
    except (TypeError, ValueError) as exc:
        raise ParseError(f"simulated report field malformed: {exc}") from exc
    if len(measurement) != 48 or len(report_data) != 64 or not isinstance(doc["debug"], bool):
        raise ParseError("simulated report field has the wrong size or type")
    return SimReport(SIM_REPORT_VERSION, measurement, report_data, doc["debug"], tcb)


def verify_sim_report(raw: bytes, platform_public_key: Ed25519PublicKey) -> SimReport:
    report = parse_sim_report(raw)
    try:
        platform_public_key.verify(raw[-_SIG_BYTES:], raw[:-_SIG_BYTES])
    except InvalidSignature as exc:
        raise SignatureError("simulated report signature does not verify under the pinned platform key") from exc
    return report
