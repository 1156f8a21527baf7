"""Reduce a VerifiedReport to the TEE-neutral CpuClaims that policies and tokens use."""

from __future__ import annotations

from attestation.claims import CpuClaims, TcbStatus, TeeType
from attestation.snp.verify import VerifiedReport


def to_claims(verified: VerifiedReport) -> CpuClaims:
    """CpuClaims for a verified report; every SNP-specific field goes to `extra` as a string.

    tcb_status is UpToDate when the chain and the VEK-to-REPORTED_TCB binding verified (any CRL
    supplied was checked and did not revoke); AMD publishes no TCB-info to say more, so a report
    reduced without that binding would be Unknown.
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
    status = TcbStatus.UP_TO_DATE if verified.tcb_verified else TcbStatus.UNKNOWN
    return CpuClaims(
        tee=TeeType.SNP,
        measurement=r.measurement,
        report_data=r.report_data,
        debug=r.guest_policy.debug,
        tcb_status=status,
        tcb=tcb,
        extra=extra,
    )
