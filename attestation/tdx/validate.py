"""Appraise a verified TDX quote against a typed, default-deny policy; reduce it to CpuClaims.

Every check runs and every violation is reported together (PolicyViolation), so an operator sees
the whole mismatch at once instead of fixing one field per attempt.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from typing import Any

from attestation.claims import CpuClaims, TcbStatus, TeeType
from attestation.errors import PolicyViolation
from attestation.tdx.verify import VerifiedQuote

log = logging.getLogger(__name__)

_BYTES_SIZES = {
    "mr_config_id": 48,
    "mr_owner": 48,
    "mr_owner_config": 48,
    "report_data": 64,
    "xfam": 8,
    "td_attributes": 8,
    "min_tee_tcb_svn": 16,
}


@dataclass(frozen=True)
class Policy:
    """What a relying party accepts. Unset optional fields are not checked; the rest deny by default."""

    allowed_mrtd: tuple[bytes, ...] = ()  # empty: every MRTD is refused (unless unsafe_allow_any_mrtd)
    rtmrs: tuple[bytes | None, bytes | None, bytes | None, bytes | None] = (None, None, None, None)
    mr_config_id: bytes | None = None
    mr_owner: bytes | None = None
    mr_owner_config: bytes | None = None
    allowed_mr_seam: tuple[bytes, ...] = ()  # empty: any TDX module (its TCB is judged by tcb status)
    allowed_tcb_statuses: frozenset[TcbStatus] = field(
        default_factory=lambda: frozenset({TcbStatus.UP_TO_DATE})
    )
    min_tee_tcb_svn: bytes | None = None  # component-wise floor on TEE_TCB_SVN
    min_qe_isvsvn: int = 0
    report_data: bytes | None = None  # the expected REPORTDATA (e.g. hash(nonce || key))
    xfam: bytes | None = None
    td_attributes: bytes | None = None  # exact TDATTRIBUTES, checked in addition to the debug bit
    unsafe_allow_debug: bool = False
    unsafe_allow_any_mrtd: bool = False

    def __post_init__(self) -> None:
        if TcbStatus.REVOKED in self.allowed_tcb_statuses:
            raise ValueError("a revoked TCB can never be allowed")
        for name, size in _BYTES_SIZES.items():
            value = getattr(self, name)
            if value is not None and len(value) != size:
                raise ValueError(f"policy {name} must be {size} bytes")
        if len(self.rtmrs) != 4 or any(r is not None and len(r) != 48 for r in self.rtmrs):
            raise ValueError("policy rtmrs must be four 48-byte values or None")
        if any(len(m) != 48 for m in (*self.allowed_mrtd, *self.allowed_mr_seam)):
            raise ValueError("MRTD / MRSEAM values must be 48 bytes")
        if self.unsafe_allow_debug:
            log.warning("TDX policy allows debug TDs (unsafe_allow_debug): TD memory is readable by the host")
        if self.unsafe_allow_any_mrtd:
            log.warning("TDX policy accepts any MRTD (unsafe_allow_any_mrtd)")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Policy:
        """Build from JSON-like data: hex strings for byte fields; unknown keys raise ValueError."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ValueError(f"unknown TDX policy keys: {', '.join(unknown)}")
        kw: dict[str, Any] = {}
        for key, value in data.items():
            if key in ("allowed_mrtd", "allowed_mr_seam"):
                kw[key] = tuple(_hex(v, key) for v in _list(value, key))
            elif key == "rtmrs":
                items = _list(value, key)
                kw[key] = tuple(None if v is None else _hex(v, key) for v in items)
            elif key == "allowed_tcb_statuses":
                kw[key] = frozenset(TcbStatus(v) for v in _list(value, key))
            elif key in _BYTES_SIZES:
                kw[key] = None if value is None else _hex(value, key)
            elif key == "min_qe_isvsvn":
                if not isinstance(value, int) or isinstance(value, bool):
                    raise ValueError("min_qe_isvsvn must be an integer")
                kw[key] = value
            else:
                if not isinstance(value, bool):
                    raise ValueError(f"{key} must be a boolean")
                kw[key] = value
        return cls(**kw)


def _list(value: Any, key: str) -> list[Any]:
    if not isinstance(value, list | tuple):
        raise ValueError(f"{key} must be a list")
    return list(value)


def _hex(value: Any, key: str) -> bytes:
    if not isinstance(value, str):
        raise ValueError(f"{key}: expected a hex string")
    return bytes.fromhex(value)


def validate(verified: VerifiedQuote, policy: Policy) -> None:
    """Raise PolicyViolation listing every way `verified` fails `policy`; return None if it passes."""
    body = verified.quote.body
    bad: list[str] = []
    if not policy.unsafe_allow_any_mrtd and body.mr_td not in policy.allowed_mrtd:
        bad.append(f"MRTD {body.mr_td.hex()} is not allowed")
    for i, (want, have) in enumerate(zip(policy.rtmrs, body.rtmrs, strict=True)):
        if want is not None and want != have:
            bad.append(f"RTMR{i} {have.hex()} != expected {want.hex()}")
    for name in ("mr_config_id", "mr_owner", "mr_owner_config", "report_data", "xfam", "td_attributes"):
        want, have = getattr(policy, name), getattr(body, name)
        if want is not None and want != have:
            bad.append(f"{name} {have.hex()} != expected {want.hex()}")
    if policy.allowed_mr_seam and body.mr_seam not in policy.allowed_mr_seam:
        bad.append(f"MRSEAM {body.mr_seam.hex()} is not an allowed TDX module")
    if body.debug and not policy.unsafe_allow_debug:
        bad.append("TD is in debug mode (TDATTRIBUTES.DEBUG set)")
    status = verified.tcb.status if verified.tcb else TcbStatus.UNKNOWN
    if status not in policy.allowed_tcb_statuses:
        bad.append(f"TCB status {status.value} is not allowed")
    if policy.min_tee_tcb_svn is not None and any(
        h < w for h, w in zip(body.tee_tcb_svn, policy.min_tee_tcb_svn, strict=True)
    ):
        bad.append(f"TEE_TCB_SVN {body.tee_tcb_svn.hex()} is below {policy.min_tee_tcb_svn.hex()}")
    if verified.quote.signature.qe_report.isv_svn < policy.min_qe_isvsvn:
        bad.append(f"QE ISVSVN {verified.quote.signature.qe_report.isv_svn} is below {policy.min_qe_isvsvn}")
    if bad:
        raise PolicyViolation(bad)


def to_claims(verified: VerifiedQuote) -> CpuClaims:
    q = verified.quote
    body, qe, pck = q.body, q.signature.qe_report, verified.pck
    tcb: dict[str, int] = {f"tee_tcb_svn_{i:02d}": v for i, v in enumerate(body.tee_tcb_svn)}
    tcb |= {f"sgx_tcb_comp_{i + 1:02d}": v for i, v in enumerate(pck.cpusvn_components)}
    tcb |= {
        "pcesvn": pck.pcesvn,
        "qe_isvsvn": qe.isv_svn,
        "tdx_module_svn_minor": body.tee_tcb_svn[0],
        "tdx_module_svn_major": body.tee_tcb_svn[1],
    }
    if verified.tcb is not None:
        tcb["tcb_evaluation_data_number"] = verified.tcb.tcb_evaluation_number
    extra = {f"rtmr{i}": r.hex() for i, r in enumerate(body.rtmrs)}
    for name in (
        "mr_config_id",
        "mr_owner",
        "mr_owner_config",
        "mr_seam",
        "mr_signer_seam",
        "seam_attributes",
        "td_attributes",
        "xfam",
        "tee_tcb_svn",
    ):
        extra[name] = getattr(body, name).hex()
    if body.tee_tcb_svn2 is not None and body.mr_servicetd is not None:
        extra |= {"tee_tcb_svn2": body.tee_tcb_svn2.hex(), "mr_servicetd": body.mr_servicetd.hex()}
    extra |= {
        "fmspc": pck.fmspc.hex(),
        "pceid": pck.pceid.hex(),
        "pck_ca": verified.pck_ca,
        "quote_version": str(q.header.version),
        "qe_mr_signer": qe.mr_signer.hex(),
        "qe_mr_enclave": qe.mr_enclave.hex(),
    }
    if verified.tcb is not None and verified.tcb.module_id:
        extra["tdx_module_identity"] = verified.tcb.module_id
    extra["migratable"] = str(body.migratable).lower()
    return CpuClaims(
        tee=TeeType.TDX,
        measurement=body.mr_td,
        report_data=body.report_data,
        debug=body.debug,
        tcb_status=verified.tcb.status if verified.tcb else TcbStatus.UNKNOWN,
        tcb=tcb,
        extra=extra,
        advisory_ids=verified.tcb.advisory_ids if verified.tcb else (),
    )
