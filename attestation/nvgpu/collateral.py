"""The GPU collateral a verifier appraises NVIDIA evidence with: RIMs and OCSP answers.

Both come from the collateral store's `nvidia/` folder (`sealed attest collateral import`, for
brokers and clients without internet): signed SWID RIMs (one per driver or VBIOS version) and
signed OCSP responses for the device and RIM certificate chains. The store is read again for
every verification, so an import takes effect without a restart. Nothing read here is trusted:
`verify_gpu_evidence` checks each RIM's signature and chain and each OCSP answer's signature.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from attestation.errors import CollateralError, ParseError
from attestation.nvgpu.abi import parse_evidence
from attestation.nvgpu.rim import parse_rim
from attestation.ocsp import OcspChecker, OfflineOcspChecker
from attestation.ocsp_imported import ImportedOcspChecker

RIM_GLOB = "rim-*.xml"
OCSP_GLOB = "ocsp-*.der"


@dataclass(frozen=True)
class GpuCollateral:
    rims: tuple[bytes, ...] = ()
    ocsp: OcspChecker = field(default_factory=OfflineOcspChecker)

    def rims_for(self, evidence: Sequence[bytes]) -> tuple[bytes, ...]:
        """The RIMs for the versions these GPUs report; a store holds RIMs for a whole fleet, and
        `verify_gpu_list` refuses a RIM that applies to no GPU of the bundle it is given."""
        wanted: set[str] = set()
        for blob in evidence:
            ev = parse_evidence(blob)
            wanted |= {ev.driver_version.upper(), ev.vbios_version.upper()}
        return tuple(r for r in self.rims if parse_rim(r).version.upper() in wanted)


class GpuCollateralSource(Protocol):
    def load(self) -> GpuCollateral: ...


def rim_file_name(rim: bytes) -> str:
    """One RIM per version: importing a RIM for a version replaces the one held before."""
    try:
        version = parse_rim(rim).version
    except ParseError as exc:
        raise CollateralError(f"not an NVIDIA RIM: {exc}") from exc
    return f"rim-{hashlib.sha256(version.upper().encode()).hexdigest()[:16]}.xml"


def ocsp_file_name(response: bytes) -> str:
    return f"ocsp-{hashlib.sha256(response).hexdigest()[:16]}.der"


@dataclass(frozen=True)
class GpuCollateralDir:
    """`<collateral>/nvidia`, as `attestation.collateral.CollateralStore` imports into it."""

    path: Path

    def load(self) -> GpuCollateral:
        if not self.path.is_dir():
            return GpuCollateral()
        rims = tuple(p.read_bytes() for p in sorted(self.path.glob(RIM_GLOB)))
        try:
            ocsp = ImportedOcspChecker.of(p.read_bytes() for p in sorted(self.path.glob(OCSP_GLOB)))
        except ParseError as exc:
            raise CollateralError(f"NVIDIA collateral in {self.path}: {exc}") from exc
        return GpuCollateral(rims=rims, ocsp=ocsp)
