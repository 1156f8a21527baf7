"""Typed claims that every TEE verifier produces, so policy and tokens need not know the TEE."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any


class TeeType(enum.StrEnum):
    SNP = "snp"
    TDX = "tdx"
    SIM = "sim"


class TcbStatus(enum.StrEnum):
    UP_TO_DATE = "UpToDate"
    SW_HARDENING_NEEDED = "SWHardeningNeeded"
    CONFIGURATION_NEEDED = "ConfigurationNeeded"
    CONFIGURATION_AND_SW_HARDENING_NEEDED = "ConfigurationAndSWHardeningNeeded"
    OUT_OF_DATE = "OutOfDate"
    OUT_OF_DATE_CONFIGURATION_NEEDED = "OutOfDateConfigurationNeeded"
    REVOKED = "Revoked"
    UNKNOWN = "Unknown"


@dataclass(frozen=True)
class GpuClaims:
    """One verified GPU (NVIDIA Hopper SPDM report)."""

    index: int
    arch: str
    cc_enabled: bool
    nonce: bytes
    measurements: dict[int, bytes]
    driver_version: str
    vbios_version: str
    fwid: bytes
    ueid: str
    rim_matched: bool | None = None  # None: no RIM was provided
    ocsp_status: str = "unknown"  # attestation.ocsp.OcspStatus over the device (and RIM) chains


@dataclass(frozen=True)
class CpuClaims:
    """One verified CPU TEE report, reduced to what policies appraise."""

    tee: TeeType
    measurement: bytes  # SNP MEASUREMENT, TDX MRTD, sim: hash over worker code and config
    report_data: bytes  # 64 bytes
    debug: bool
    tcb_status: TcbStatus
    tcb: dict[str, int] = field(default_factory=dict)  # component -> svn, TEE-specific names
    extra: dict[str, str] = field(default_factory=dict)  # hex of TEE-specific fields (rtmr0, host_data...)
    advisory_ids: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "tee": self.tee.value,
            "measurement": self.measurement.hex(),
            "report_data": self.report_data.hex(),
            "debug": self.debug,
            "tcb_status": self.tcb_status.value,
            "tcb": dict(self.tcb),
            "advisory_ids": list(self.advisory_ids),
            **self.extra,
        }
