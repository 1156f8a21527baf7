"""TCB status for a TDX quote, following Intel's DCAP Quote Verification Library algorithm.

Steps (Intel SGX/TDX DCAP QVL "TDX quote verification", PCS API v4 TCB Info v3 semantics):
  T1. Platform level: the first tcbLevels entry (they are ordered newest first) whose 16 SGX
      components are <= the PCK certificate's CPUSVN components, whose PCESVN is <= the PCK's, and
      whose 16 TDX components are <= TEE_TCB_SVN. When TEE_TCB_SVN[1] (TDX module major version)
      is non-zero and tdxModuleIdentities exist, components 0 and 1 are left to step T2.
  T2. TDX module: with TEE_TCB_SVN[1] > 0, identity "TDX_%02X" must exist, match MRSIGNERSEAM and
      SEAMATTRIBUTES (masked), and its first level with isvsvn <= TEE_TCB_SVN[0] gives its status;
      otherwise MRSIGNERSEAM/SEAMATTRIBUTES are checked against tdxModule only.
  T3. QE identity: MRSIGNER, ISVPRODID, MISCSELECT and ATTRIBUTES (masked) must match, and the first
      level with isvsvn <= the QE's ISVSVN gives the QE status (none: Revoked).
  T4. Converge: a worse TDX module or QE status downgrades the platform status; advisories merge.
"""

from __future__ import annotations

from dataclasses import dataclass

from attestation.claims import TcbStatus
from attestation.errors import CollateralError
from attestation.tdx.abi import QeReport, TdQuoteBody
from attestation.tdx.collateral import Level, ModuleIdentity, QeIdentity, TcbInfo
from attestation.tdx.pck import PckExtensions

S = TcbStatus


@dataclass(frozen=True)
class TcbResult:
    status: TcbStatus
    advisory_ids: tuple[str, ...]
    platform_status: TcbStatus
    platform_tcb_date: str
    module_id: str | None
    module_status: TcbStatus | None
    qe_status: TcbStatus
    qe_tcb_date: str | None
    tcb_evaluation_number: int


def _masked_equal(a: bytes, b: bytes, mask: bytes) -> bool:
    return len(a) == len(b) == len(mask) and all(
        (x & m) == (y & m) for x, y, m in zip(a, b, mask, strict=True)
    )


def platform_level(info: TcbInfo, pck: PckExtensions, body: TdQuoteBody) -> Level:
    # T1: compare component-wise against the PCK's SVNs (not the opaque CPUSVN bytes).
    skip = 2 if body.tee_tcb_svn[1] > 0 and info.module_identities else 0
    tee = body.tee_tcb_svn
    for level in info.levels:
        if (
            all(lv <= have for lv, have in zip(level.sgx, pck.cpusvn_components, strict=True))
            and level.pcesvn <= pck.pcesvn
            and all(level.tdx[i] <= tee[i] for i in range(skip, 16))
        ):
            return level
    raise CollateralError(
        "no matching TCB level: platform SVNs are below every tcbInfo level (TCB not supported)"
    )


def module_level(info: TcbInfo, body: TdQuoteBody) -> tuple[str | None, Level | None]:
    # T2: the module identity (TDX 1.5+ tcbInfo) or the plain tdxModule signer/attributes.
    major = body.tee_tcb_svn[1]
    if major == 0 or not info.module_identities:
        _check_module(info.module, body, "tdxModule")
        return None, None
    wanted = f"TDX_{major:02X}"
    for ident in info.module_identities:
        if ident.id.upper() == wanted:
            _check_module(ident, body, wanted)
            for level in ident.levels:
                if level.isvsvn <= body.tee_tcb_svn[0]:
                    return wanted, level
            raise CollateralError(
                f"no matching TCB level for TDX module {wanted} (minor svn {body.tee_tcb_svn[0]})"
            )
    raise CollateralError(f"no TDX module identity {wanted} in tcbInfo")


def _check_module(ident: ModuleIdentity, body: TdQuoteBody, what: str) -> None:
    if ident.mrsigner != body.mr_signer_seam:
        raise CollateralError(f"{what}: MRSIGNERSEAM does not match tcbInfo")
    if not _masked_equal(body.seam_attributes, ident.attributes, ident.attributes_mask):
        raise CollateralError(f"{what}: SEAMATTRIBUTES do not match tcbInfo")


def qe_level(identity: QeIdentity, qe: QeReport) -> Level | None:
    # T3: the quoting enclave must be Intel's TD_QE at an acceptable ISVSVN.
    if qe.mr_signer != identity.mrsigner:
        raise CollateralError("QE MRSIGNER does not match the TD_QE identity")
    if qe.isv_prod_id != identity.isvprodid:
        raise CollateralError(f"QE ISVPRODID {qe.isv_prod_id} does not match {identity.isvprodid}")
    if qe.miscselect & identity.miscselect_mask != identity.miscselect & identity.miscselect_mask:
        raise CollateralError("QE MISCSELECT does not match the TD_QE identity under its mask")
    if not _masked_equal(qe.attributes, identity.attributes, identity.attributes_mask):
        raise CollateralError("QE ATTRIBUTES do not match the TD_QE identity under its mask")
    for level in identity.levels:
        if level.isvsvn <= qe.isv_svn:
            return level
    return None


def _downgrade(platform: TcbStatus, other: TcbStatus) -> TcbStatus:
    # T4: Intel QVL's convergence: a revoked part revokes; an out-of-date part makes the platform
    # out of date while keeping its "configuration needed" part.
    if other is S.REVOKED or platform is S.REVOKED:
        return S.REVOKED
    if other in (S.OUT_OF_DATE, S.OUT_OF_DATE_CONFIGURATION_NEEDED):
        if platform in (
            S.CONFIGURATION_NEEDED,
            S.CONFIGURATION_AND_SW_HARDENING_NEEDED,
            S.OUT_OF_DATE_CONFIGURATION_NEEDED,
        ):
            return S.OUT_OF_DATE_CONFIGURATION_NEEDED
        return S.OUT_OF_DATE
    if other is S.SW_HARDENING_NEEDED and platform is S.UP_TO_DATE:
        return S.SW_HARDENING_NEEDED
    return platform


def evaluate(
    info: TcbInfo, identity: QeIdentity, pck: PckExtensions, body: TdQuoteBody, qe: QeReport
) -> TcbResult:
    if info.fmspc != pck.fmspc or info.pce_id != pck.pceid:
        raise CollateralError(
            f"tcbInfo is for FMSPC {info.fmspc.hex()}/PCEID {info.pce_id.hex()}, "
            f"PCK has {pck.fmspc.hex()}/{pck.pceid.hex()}"
        )
    plat = platform_level(info, pck, body)
    module_id, mod = module_level(info, body)
    qe_lvl = qe_level(identity, qe)
    qe_status = qe_lvl.status if qe_lvl else S.REVOKED
    status = plat.status
    advisories = list(plat.advisory_ids)
    for part in (mod, qe_lvl):
        if part is not None:
            status = _downgrade(status, part.status)
            advisories += [a for a in part.advisory_ids if a not in advisories]
    if qe_lvl is None:
        status = S.REVOKED
    return TcbResult(
        status=status,
        advisory_ids=tuple(advisories),
        platform_status=plat.status,
        platform_tcb_date=plat.tcb_date,
        module_id=module_id,
        module_status=mod.status if mod else None,
        qe_status=qe_status,
        qe_tcb_date=qe_lvl.tcb_date if qe_lvl else None,
        tcb_evaluation_number=min(info.evaluation_number, identity.evaluation_number),
    )
