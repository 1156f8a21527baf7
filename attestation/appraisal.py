"""Appraisal of attestation results against a relying party's typed, default-deny policy.

Used by clients before they send a prompt (and by `sealed attest verify --policy`). The key broker
appraises through policy.release instead, which adds tenant, model and signer conditions.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from attestation.errors import PolicyViolation
from attestation.token import AttestationClaims, ResultClaims

log = logging.getLogger(__name__)

_ACCEPTABLE_TCB_DEFAULT = frozenset({"UpToDate"})


@dataclass(frozen=True)
class AppraisalPolicy:
    allowed_tee: frozenset[str] = frozenset()  # empty allows nothing
    allowed_measurements: frozenset[str] = frozenset()  # lower-case hex; empty allows nothing
    acceptable_tcb_status: frozenset[str] = _ACCEPTABLE_TCB_DEFAULT
    min_tcb: Mapping[str, int] = field(default_factory=dict)
    allow_debug: bool = False
    require_gpu_cc: bool = False
    unsafe_allow_simulated_tee: bool = False
    # The init-data digests (attestation/initdata.py: SNP HOST_DATA, TDX MRCONFIGID; lower-case hex)
    # of the workloads allowed; None: not required (the launch digest alone: any image, any arguments).
    allowed_workload_ids: frozenset[str] | None = None
    max_vmpl: int = 0  # SNP: the report must come from VMPL 0 (the guest's most privileged level)
    allow_migration_agent: bool = False
    # TDX boot chains (the same shape as a release policy's, policy/rtmrs.py): a list of sets, each
    # naming some of rtmr0..rtmr3 as hex; a TDX result passes when one set matches. None: not required.
    # Stored as sorted (name, hex) pairs per set, so the policy stays hashable.
    allowed_rtmrs: tuple[tuple[tuple[str, str], ...], ...] | None = None
    require_gpu_rim_match: bool = False  # every GPU matches the RIMs imported for its versions
    require_gpu_ocsp_good: bool = False  # every GPU's chains answered "good" by imported OCSP

    def __post_init__(self) -> None:
        object.__setattr__(self, "allowed_measurements", frozenset(m.lower() for m in self.allowed_measurements))
        if self.allowed_workload_ids is not None:
            object.__setattr__(self, "allowed_workload_ids",
                               frozenset(w.lower() for w in self.allowed_workload_ids))
        if self.allowed_rtmrs is not None:
            object.__setattr__(self, "allowed_rtmrs", _rtmr_sets(self.allowed_rtmrs))
        if self.unsafe_allow_simulated_tee:
            log.warning("appraisal policy accepts the simulated TEE: no hardware protection")

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> AppraisalPolicy:
        known = {f.name for f in fields(cls)}
        unknown = set(doc) - known
        if unknown:
            raise PolicyViolation([f"unknown policy keys: {sorted(unknown)}"])
        args: dict[str, Any] = dict(doc)
        for key in ("allowed_tee", "allowed_measurements", "acceptable_tcb_status", "allowed_workload_ids"):
            if args.get(key) is not None:
                args[key] = frozenset(args[key])
        return cls(**args)


_RTMR_NAMES = ("rtmr0", "rtmr1", "rtmr2", "rtmr3")


def _rtmr_sets(sets: Any) -> tuple[tuple[tuple[str, str], ...], ...]:
    """Each set an object naming some of rtmr0..rtmr3 as 96 hex characters; PolicyViolation otherwise."""
    if isinstance(sets, str | bytes) or not isinstance(sets, list | tuple):
        raise PolicyViolation(["allowed_rtmrs must be a list of objects"])
    out = []
    for entry in sets:
        entry = dict(entry) if isinstance(entry, tuple) else entry  # already normalised
        if not isinstance(entry, Mapping) or not entry or not set(entry) <= set(_RTMR_NAMES):
            raise PolicyViolation(["each allowed_rtmrs entry names some of rtmr0..rtmr3, nothing else"])
        values = {str(k): str(v).lower() for k, v in entry.items()}
        if any(len(v) != 96 or not set(v) <= set("0123456789abcdef") for v in values.values()):
            raise PolicyViolation(["allowed_rtmrs values must be 96 hex characters (48 bytes)"])
        out.append(tuple(sorted(values.items())))
    return tuple(out)


def _rtmrs_allowed(sets: tuple[tuple[tuple[str, str], ...], ...], rtmrs: tuple[str, ...]) -> bool:
    have = dict(zip(_RTMR_NAMES, rtmrs, strict=False))
    return len(rtmrs) == len(_RTMR_NAMES) and any(all(have[k] == v for k, v in s) for s in sets)


def appraise(claims: AttestationClaims | ResultClaims | Mapping[str, Any], policy: AppraisalPolicy) -> None:
    """Raise PolicyViolation listing every violated condition; return only when all hold.

    `claims`: a verified token's claims (`TokenVerifier.verify_claims`), or an attestation result's
    claim set (`AttestationResult.token_claims()`), parsed once into `ResultClaims`.
    """
    if isinstance(claims, AttestationClaims):
        result = claims.result
    elif isinstance(claims, ResultClaims):
        result = claims
    else:
        result = ResultClaims.from_claims(claims)
    violations: list[str] = []
    if result.tee not in policy.allowed_tee:
        violations.append(f"TEE {result.tee!r} is not allowed")
    if result.measurement not in policy.allowed_measurements:
        violations.append("measurement is not in the allowed set")
    insecure = result.insecure or result.tee == "sim"
    if insecure and not policy.unsafe_allow_simulated_tee:
        violations.append("evidence comes from a simulated (insecure) TEE")
    if not insecure and result.tcb_status not in policy.acceptable_tcb_status:
        violations.append(f"TCB status {result.tcb_status!r} is not acceptable")
    for name, floor in sorted(policy.min_tcb.items()):
        if result.tcb.get(name, -1) < floor:
            violations.append(f"TCB component {name} below {floor}")
    if result.debug and not policy.allow_debug:
        violations.append("debug mode is on")
    if policy.allowed_workload_ids is not None and result.workload_id not in policy.allowed_workload_ids:
        violations.append("workload identity (init-data digest) is not in the allowed set")
    if result.vmpl > policy.max_vmpl:
        violations.append(f"report comes from VMPL {result.vmpl}, above {policy.max_vmpl}")
    if result.migration_agent and not policy.allow_migration_agent:
        violations.append("a migration agent may export the guest's state")
    if policy.require_gpu_cc and (not result.gpus or not all(g.cc_enabled for g in result.gpus)):
        violations.append("GPU confidential computing is not on for every GPU")
    if policy.allowed_rtmrs is not None and result.tee == "tdx" and not _rtmrs_allowed(policy.allowed_rtmrs,
                                                                                       result.rtmrs):
        violations.append("TDX RTMRs (kernel, initrd, command line) are not an allowed set")
    if (policy.require_gpu_rim_match or policy.require_gpu_ocsp_good) and not result.gpus:
        violations.append("no GPU evidence to appraise against RIMs and OCSP")
    for g in result.gpus if policy.require_gpu_rim_match else ():
        if g.rim_matched is False:
            violations.append(f"GPU measurements do not match the imported RIMs (GPU {g.index})")
        elif g.rim_matched is None:
            violations.append(f"no imported driver and VBIOS RIMs for GPU {g.index}'s versions")
    for g in result.gpus if policy.require_gpu_ocsp_good else ():
        if g.ocsp_status != "good":
            violations.append(f"GPU {g.index} certificate status is OCSP {g.ocsp_status!r}, not 'good'")
    if violations:
        raise PolicyViolation(violations)
