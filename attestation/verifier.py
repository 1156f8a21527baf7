"""Verify an evidence bundle: CPU evidence, GPU evidence, and the binding of the runtime data.

The verifier is a pure function of the bundle, the expected nonce, the clock and the pinned trust
anchors. It returns typed claims or raises; appraisal against a policy is a separate step.
"""

from __future__ import annotations

import datetime as dt
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from attestation.bundle import EvidenceBundle, check_binding
from attestation.claims import CpuClaims, GpuClaims, TcbStatus, TeeType
from attestation.errors import FreshnessError, SignatureError, UnsupportedError
from attestation.initdata import workload_id_of
from attestation.sim import verify_sim_report

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class VerifierTrust:
    """Pinned trust anchors. A sim platform key is only present where simulated TEEs are accepted."""

    roots_dir: Path | None = None
    sim_platform_key: Ed25519PublicKey | None = None
    snp_fetcher: Any = None  # attestation.snp.CollateralFetcher (KDS, cached/offline); None: certs in bundle
    tdx_collateral: Any = None  # attestation.tdx.CollateralSource, e.g. attestation.tdx.pcs.PcsFetcher
    # attestation.nvgpu.GpuCollateralSource: imported RIMs and OCSP answers (CollateralStore.nvidia);
    # None: GPUs are verified without them (no RIM comparison, every OCSP status "unknown").
    gpu_collateral: Any = None


@dataclass(frozen=True)
class AttestationResult:
    cpu: CpuClaims
    gpus: tuple[GpuClaims, ...]
    nonce: bytes
    hpke_public_key: bytes
    evidence_digest: str
    channel_binding: bytes = b""

    @property
    def insecure(self) -> bool:
        return self.cpu.tee is TeeType.SIM

    @property
    def workload_id(self) -> str:
        """The init-data digest the hardware carries (SNP HOST_DATA, TDX MRCONFIGID), hex; "" for sim."""
        return workload_id_of(self.cpu.tee.value, self.cpu.extra)

    @property
    def vmpl(self) -> int:
        """The privilege level the SNP report was requested at (0 for TDX and sim, which have none)."""
        return int(self.cpu.extra.get("vmpl", "0"))

    @property
    def rtmrs(self) -> tuple[str, ...]:
        """TDX RTMR0..3 from the signed quote (hex), which the CC event log, when sent, replays to."""
        if self.cpu.tee is not TeeType.TDX:
            return ()
        return tuple(self.cpu.extra[f"rtmr{i}"] for i in range(4))

    @property
    def migration_agent(self) -> bool:
        """SNP: a migration agent may be bound (GUEST_POLICY.MIGRATE_MA); TDX: TDATTRIBUTES.MIGRATABLE."""
        return self.cpu.extra.get("migrate_ma", self.cpu.extra.get("migratable", "false")) == "true"

    def token_claims(self) -> dict[str, Any]:
        return {
            "eat_nonce": self.nonce.hex(),
            "tee": self.cpu.tee.value,
            "measurement": self.cpu.measurement.hex(),
            "tcb_status": self.cpu.tcb_status.value,
            "tcb": dict(self.cpu.tcb),
            "debug": self.cpu.debug,
            "workload_id": self.workload_id,
            "vmpl": self.vmpl,
            "migration_agent": self.migration_agent,
            **({"rtmrs": list(self.rtmrs)} if self.rtmrs else {}),
            "report_data": self.cpu.report_data.hex(),
            "runtime_data": {"nonce": self.nonce.hex(), "hpke_public_key": self.hpke_public_key.hex(),
                             "channel_binding": self.channel_binding.hex()},
            "gpus": [
                {
                    "index": g.index,
                    "arch": g.arch,
                    "cc_enabled": g.cc_enabled,
                    "driver_version": g.driver_version,
                    "vbios_version": g.vbios_version,
                    "ueid": g.ueid,
                    "rim_matched": g.rim_matched,
                    "ocsp_status": g.ocsp_status,
                }
                for g in self.gpus
            ],
            "evidence_digest": self.evidence_digest,
            "insecure": self.insecure,
        }


def _check_event_log(log: bytes, rtmrs: tuple[bytes, ...]) -> None:
    """The CC event log must replay exactly to the RTMRs the quote signs (TDX module spec,
    TDG.MR.RTMR.EXTEND); then each event says what was measured into them."""
    from attestation.tdx.eventlog import parse_cc_event_log, replay_rtmrs

    if tuple(replay_rtmrs(parse_cc_event_log(log))) != tuple(rtmrs):
        raise SignatureError("the CC event log does not replay to the RTMRs in the signed quote")


def _verify_cpu(bundle: EvidenceBundle, now: dt.datetime, trust: VerifierTrust) -> CpuClaims:
    if bundle.event_log and bundle.tee != TeeType.TDX:
        raise UnsupportedError("an event log is only accepted with TDX evidence")
    if bundle.tee == TeeType.SIM:
        if trust.sim_platform_key is None:
            raise UnsupportedError("simulated TEE evidence is not accepted by this verifier")
        report = verify_sim_report(bundle.cpu_evidence, trust.sim_platform_key)
        return CpuClaims(
            tee=TeeType.SIM,
            measurement=report.measurement,
            report_data=report.report_data,
            debug=report.debug,
            tcb_status=TcbStatus.UNKNOWN,
            tcb=report.tcb,
        )
    if bundle.tee == TeeType.SNP:
        from attestation import snp

        # The VCEK/VLEK (and optionally ASK/ARK) travel in the bundle; roots stay pinned here.
        # A verifier with a collateral source also checks the CRL from it (KDS, cache or an imported
        # bundle): a revoked VCEK or an expired CRL is refused with its reason.
        verified = snp.verify_report(bundle.cpu_evidence, now=now, certs=bundle.cpu_certificates,
                                     roots_dir=trust.roots_dir, fetcher=trust.snp_fetcher,
                                     fetch_crl=trust.snp_fetcher is not None)
        return snp.to_claims(verified)
    if bundle.tee == TeeType.TDX:
        from attestation import tdx

        # The PCK chain is inside the quote; tcbInfo/qeIdentity/CRLs come from the verifier's own
        # collateral source (Intel PCS, cached or offline), never from the attester.
        if trust.tdx_collateral is None:
            raise UnsupportedError("no TDX collateral source configured for this verifier")
        quote = tdx.verify_quote(bundle.cpu_evidence, now=now, roots_dir=trust.roots_dir,
                                 fetcher=trust.tdx_collateral)
        if bundle.event_log:
            _check_event_log(bundle.event_log, quote.quote.body.rtmrs)
        return tdx.to_claims(quote)
    raise UnsupportedError(f"unknown TEE type {bundle.tee!r}")


def _verify_gpus(bundle: EvidenceBundle, now: dt.datetime, trust: VerifierTrust) -> tuple[GpuClaims, ...]:
    if not bundle.gpus:
        return ()
    from attestation import nvgpu

    # Every GPU must answer the same nonce as the CPU evidence, each with its own device key. With
    # imported collateral, each is also compared with the RIMs for its driver and VBIOS versions
    # and its chains' OCSP answers are checked (a REVOKED answer fails verification here).
    options = nvgpu.GpuVerifyOptions(roots_dir=trust.roots_dir)
    if trust.gpu_collateral is not None:
        collateral = trust.gpu_collateral.load()
        options = nvgpu.GpuVerifyOptions(roots_dir=trust.roots_dir, ocsp=collateral.ocsp,
                                         rims=collateral.rims_for([g.evidence for g in bundle.gpus]))
    verified = nvgpu.verify_gpu_list([(g.evidence, g.certificate_chain) for g in bundle.gpus],
                                     nonce=bundle.runtime_data.nonce, now=now, options=options)
    return tuple(nvgpu.to_claims(v, i) for i, v in enumerate(verified))


def verify_bundle(
    bundle: EvidenceBundle, *, expected_nonce: bytes, now: dt.datetime, trust: VerifierTrust
) -> AttestationResult:
    # 1. Freshness: the runtime data must carry the nonce the relying party issued.
    if bundle.runtime_data.nonce != expected_nonce:
        raise FreshnessError("evidence carries a different nonce than the one issued")
    # 2. CPU evidence: signature, chain to pinned roots, TCB (per TEE).
    cpu = _verify_cpu(bundle, now, trust)
    # 3. Binding: REPORT_DATA commits to nonce, HPKE key and the GPU evidence.
    check_binding(cpu.report_data, bundle)
    # 4. GPU evidence, collected with the same nonce.
    gpus = _verify_gpus(bundle, now, trust)
    return AttestationResult(
        cpu=cpu,
        gpus=gpus,
        nonce=bundle.runtime_data.nonce,
        hpke_public_key=bundle.runtime_data.hpke_public_key,
        evidence_digest=bundle.digest(),
        channel_binding=bundle.runtime_data.channel_binding,
    )
