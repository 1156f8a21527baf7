"""Reduce a VerifiedReport to the TEE-neutral CpuClaims that policies and tokens use."""

from __future__ import annotations

from attestation.claims import CpuClaims, TcbStatus, TeeType
from attestation.snp.verify import VerifiedReport


def to_claims(verified: VerifiedReport) -> CpuClaims:
    """CpuClaims for a verified report; every SNP-specific field goes to `extra` as a string.

    AMD publishes no TCB-info (no "latest TCB" to compare with), so the status says only what the
    report proves: UpToDate when the chain and the VEK-to-REPORTED_TCB binding verified and
    REPORTED_TCB is at or above COMMITTED_TCB in every component (the host cannot present a VCEK of
    a TCB older than the firmware committed to); OutOfDate when it is below; Unknown without that
    binding. A vendor-published floor is a policy's `min_tcb` (components bl, tee, snp, ucode, fmc).
    """
    r = verified.report
    fw = f"{r.current_major}.{r.current_minor}.{r.current_build}"
    committed_fw = f"{r.committed_major}.{r.committed_minor}.{r.committed_build}"
    extra = {
        "snp_version": str(r.version),
        "product": verified.product.value,
        "signer": verified.signer.value,
        "policy": f"{r.policy:#x}",
        "platform_info": f"{r.platform_info:#x}",
        "vmpl": str(r.vmpl),
        "host_data": r.host_data.hex(),
        "id_key_digest": r.id_key_digest.hex(),
        "author_key_digest": r.author_key_digest.hex(),
        "family_id": r.family_id.hex(),
        "image_id": r.image_id.hex(),
        "report_id": r.report_id.hex(),
        "report_id_ma": r.report_id_ma.hex(),
        "chip_id": r.chip_id.hex(),
        "current_tcb": f"{r.current_tcb:#018x}",
        "reported_tcb": f"{r.reported_tcb:#018x}",
        "committed_tcb": f"{r.committed_tcb:#018x}",
        "launch_tcb": f"{r.launch_tcb:#018x}",
        "firmware": fw,
        "committed_firmware": committed_fw,
        "crl_checked": str(verified.chain.crl_checked).lower(),
    }
    if r.version >= 5:
        extra["launch_mit_vector"] = f"{r.launch_mit_vector:#018x}"
        extra["current_mit_vector"] = f"{r.current_mit_vector:#018x}"
    tcb = {**verified.reported_tcb.as_dict(), "guest_svn": r.guest_svn}
    extra["migrate_ma"] = str(r.guest_policy.migrate_ma).lower()
    committed = r.tcb("committed", verified.product)
    if not verified.tcb_verified:
        status = TcbStatus.UNKNOWN
    elif verified.reported_tcb.dominates(committed):
        status = TcbStatus.UP_TO_DATE
    else:
        status = TcbStatus.OUT_OF_DATE
    return CpuClaims(
        tee=TeeType.SNP,
        measurement=r.measurement,
        report_data=r.report_data,
        debug=r.guest_policy.debug,
        tcb_status=status,
        tcb=tcb,
        extra=extra,
    )
