"""Appraise verified GPU evidence against a typed, default-deny policy; report every violation."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from attestation.claims import GpuClaims
from attestation.errors import PolicyViolation
from attestation.nvgpu.verify import VerifiedGpu
from attestation.ocsp import OcspStatus

log = logging.getLogger(__name__)


def _driver_key(version: str) -> tuple[int, ...]:
    return tuple(int(p, 10) for p in version.split("."))


def _vbios_key(version: str) -> tuple[int, ...]:
    return tuple(int(p, 16) for p in version.split("."))


@dataclass(frozen=True)
class Policy:
    """Default-deny: a Policy() with no version constraints refuses every GPU.

    Versions pass when listed in `allowed_*` or at least `min_*` (either suffices when both set).
    """

    require_cc: bool = True
    allowed_driver_versions: frozenset[str] = frozenset()
    min_driver_version: str | None = None
    allowed_vbios_versions: frozenset[str] = frozenset()
    min_vbios_version: str | None = None
    require_rim_match: bool = True
    expected_nonce: bytes | None = None
    allowed_feature_flags: frozenset[str] = frozenset()  # SPT/MPT/PPCIE; empty: any
    expected_gpu_count: int | None = None
    # Offline verifiers cannot learn revocation; accepting that is an explicit, logged choice.
    unsafe_allow_ocsp_unknown: bool = False

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Policy:
        """Build from JSON. Unknown keys and wrong types are all reported in one PolicyViolation."""
        names = {f.name: f for f in dataclasses.fields(cls)}
        problems = [f"unknown policy key {k!r}" for k in data if k not in names]
        values: dict[str, Any] = {}
        for key, raw in data.items():
            if key not in names:
                continue
            try:
                values[key] = _convert(key, raw)
            except (TypeError, ValueError) as exc:
                problems.append(f"policy key {key!r}: {exc}")
        if problems:
            raise PolicyViolation(problems)
        return cls(**values)


def _convert(key: str, raw: Any) -> Any:
    if key in ("require_cc", "require_rim_match", "unsafe_allow_ocsp_unknown"):
        if not isinstance(raw, bool):
            raise TypeError("must be true or false")
        return raw
    if key.startswith("allowed_"):
        if not isinstance(raw, list) or not all(isinstance(v, str) for v in raw):
            raise TypeError("must be a list of strings")
        return frozenset(v.upper() if "vbios" in key or "flags" in key else v for v in raw)
    if key in ("min_driver_version", "min_vbios_version"):
        if raw is not None and not isinstance(raw, str):
            raise TypeError("must be a version string")
        if raw is not None:
            (_driver_key if "driver" in key else _vbios_key)(raw)
        return raw
    if key == "expected_nonce":
        if raw is None:
            return None
        if not isinstance(raw, str) or len(raw) != 64:
            raise ValueError("must be 64 hex characters")
        return bytes.fromhex(raw)
    if key == "expected_gpu_count":
        if raw is not None and (not isinstance(raw, int) or isinstance(raw, bool) or raw < 1):
            raise TypeError("must be a positive integer")
        return raw
    raise TypeError("unsupported key")  # pragma: no cover - every field is handled above


def to_claims(verified: VerifiedGpu, index: int) -> GpuClaims:
    ev = verified.evidence
    return GpuClaims(
        index=index,
        arch="HOPPER",
        cc_enabled=verified.cc_enabled,
        nonce=ev.nonce,
        measurements=ev.measurements,
        driver_version=ev.driver_version,
        vbios_version=ev.vbios_version,
        fwid=ev.fwid,
        ueid=verified.ueid,
        rim_matched=_rim_claim(verified),
        ocsp_status=verified.ocsp_status.value,
    )


def _rim_claim(v: VerifiedGpu) -> bool | None:
    """False when a RIM mismatches; True only when both a driver and a VBIOS RIM were compared, as
    nvtrust appraises (with one alone, the other's measurements would pass unchecked); else None."""
    if v.rim_matched is False:
        return False
    return True if v.rim_matched and {r.kind for r in v.rim_results} >= {"driver", "vbios"} else None


def _version_ok(value: str, allowed: frozenset[str], minimum: str | None, key: Any) -> bool | None:
    """True/False, or None when the policy has no constraint at all (default deny)."""
    if not allowed and minimum is None:
        return None
    if value.upper() in {a.upper() for a in allowed}:  # VBIOS hex digits print in either case
        return True
    if minimum is None:
        return False
    try:
        return bool(key(value) >= key(minimum))
    except ValueError:
        return False


def _gpu_violations(v: VerifiedGpu, claims: GpuClaims, policy: Policy) -> list[str]:
    out: list[str] = []
    tag = f"GPU {claims.index}"
    if policy.require_cc and not claims.cc_enabled:
        out.append(f"{tag}: confidential computing is not enabled")
    drv = _version_ok(claims.driver_version, policy.allowed_driver_versions, policy.min_driver_version,
                      _driver_key)
    if drv is None:
        out.append(f"{tag}: policy allows no driver version (set allowed or minimum)")
    elif not drv:
        out.append(f"{tag}: driver version {claims.driver_version} is not allowed")
    vb = _version_ok(claims.vbios_version, policy.allowed_vbios_versions, policy.min_vbios_version,
                     _vbios_key)
    if vb is None:
        out.append(f"{tag}: policy allows no VBIOS version (set allowed or minimum)")
    elif not vb:
        out.append(f"{tag}: VBIOS version {claims.vbios_version} is not allowed")
    if policy.require_rim_match:
        kinds = {r.kind for r in v.rim_results}
        if v.rim_matched is None:  # the claim is None for one kind alone too; say which is missing
            out.append(f"{tag}: no RIM was provided to appraise the measurements")
        else:
            out.extend(f"{tag}: no {k} RIM was provided" for k in ("driver", "vbios") if k not in kinds)
        if v.rim_matched is False:
            bad = [f"{r.rim_version} index {i}" for r in v.rim_results for i in r.mismatched]
            out.append(f"{tag}: measurements do not match the RIM ({', '.join(bad)})")
    if policy.expected_nonce is not None and claims.nonce != policy.expected_nonce:
        out.append(f"{tag}: nonce {claims.nonce.hex()} is not the expected one")
    flag = v.evidence.feature_flag or "NONE"
    if policy.allowed_feature_flags and flag not in policy.allowed_feature_flags:
        out.append(f"{tag}: feature flag {flag} is not allowed")
    if v.ocsp_status != OcspStatus.GOOD:
        if policy.unsafe_allow_ocsp_unknown:
            log.warning("%s: OCSP status %s accepted by unsafe_allow_ocsp_unknown", tag, v.ocsp_status)
        else:
            out.append(f"{tag}: certificate revocation status is {v.ocsp_status} (OCSP)")
    return out


def validate(verified: VerifiedGpu | Sequence[VerifiedGpu], policy: Policy) -> list[GpuClaims]:
    """Appraise one GPU or a bundle; raises PolicyViolation listing every violation, else claims."""
    gpus = [verified] if isinstance(verified, VerifiedGpu) else list(verified)
    claims = [to_claims(v, i) for i, v in enumerate(gpus)]
    violations: list[str] = []
    if not gpus:
        violations.append("no GPU evidence")
    if policy.expected_gpu_count is not None and len(gpus) != policy.expected_gpu_count:
        violations.append(f"{len(gpus)} GPUs attested, policy expects {policy.expected_gpu_count}")
    for v, c in zip(gpus, claims, strict=True):
        violations.extend(_gpu_violations(v, c, policy))
    if violations:
        raise PolicyViolation(violations)
    return claims
