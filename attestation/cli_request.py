"""What `sealed attest verify` hands each TEE's `verify_for_cli` (attestation/{snp,tdx,nvgpu}/cli.py):
one request type, so the three entry points cannot drift apart in what they accept, and the
CLI (api/cli/attest.py) builds it once whatever the TEE."""

from __future__ import annotations

import hmac
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from attestation.errors import FreshnessError


@dataclass(frozen=True)
class VerifyRequest:
    evidence: bytes  # a report, quote or GPU evidence, as the file holds it
    certs: Sequence[bytes]  # extra certificates and chains (DER or PEM)
    collateral: Sequence[bytes]  # CRLs, tcbInfo, QE identity, RIMs: each TEE recognises its own by content
    roots_dir: Path | None  # pinned roots; None: the shipped ones
    nonce: bytes | None  # the expected nonce / REPORT_DATA; None: freshness is not checked
    at: datetime  # the verification time (explicit, so a result can be reproduced)
    policy: dict[str, Any] | None  # the TEE's appraisal policy, as JSON; None: verify only
    use_collateral: bool  # False: signatures and chains only (collateral still parsed, not applied)


def check_report_data(report_data: bytes, nonce: bytes) -> None:
    """REPORT_DATA must equal the nonce right-padded with zero bytes to 64 (a 64-byte nonce: equal)."""
    if len(nonce) > 64:
        raise FreshnessError(f"nonce is {len(nonce)} bytes; REPORT_DATA holds at most 64")
    if not hmac.compare_digest(report_data, nonce.ljust(64, b"\0")):
        raise FreshnessError("REPORT_DATA does not match the expected nonce")
