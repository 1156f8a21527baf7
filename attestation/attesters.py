"""Attesters (the worker's, the key broker's), one per TEE, as the verifier dispatches: `sim`, `snp`, `tdx`, and
`nvgpu` for the GPUs beside either (`snp+nvgpu`, `tdx+nvgpu`); set, or detected (`auto`).

* SEV-SNP: configfs-tsm first (Linux >= 6.7), the /dev/sev-guest SNP_GET_EXT_REPORT ioctl as the
  fallback; the VCEK/VLEK (and ASK/ARK where the host supplies them) from the certificate table.
* TDX: a quote through configfs-tsm (the tdx_guest provider), and the CC event log (ACPI CCEL)
  where the firmware provides one, which the verifier replays to the quote's RTMRs.
* NVIDIA GPUs in CC mode: one SPDM report per GPU through NVML for the broker's nonce, with the
  device certificate chain; the CPU report's REPORT_DATA then commits to that GPU evidence
  (attestation.bundle.expected_report_data), so the broker appraises CPU and GPUs together.
  The GPUs' "ready" state is set only after the broker accepted the evidence (`mark_ready`).

The kernel and driver interfaces are the seams the fakes in devtools/sealed_fakes stand in for.
"""

from __future__ import annotations

import dataclasses
import fcntl
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from attestation.bundle import EvidenceBundle, GpuEvidence, RuntimeData, expected_report_data
from attestation.detect import detect
from attestation.errors import FreshnessError, UnsupportedError
from attestation.initdata import check_report_carries
from attestation.nvgpu import collect as nvcollect
from attestation.sim import SimTee
from attestation.snp.abi import parse_report
from attestation.snp.collect import collect_ioctl, parse_cert_table
from attestation.tdx.collect import collect_quote
from attestation.tdx.eventlog import ccel_log_length, parse_cc_event_log
from attestation.tsm import DEFAULT_BASE, TsmReportClient

log = logging.getLogger(__name__)
CPU_TEES = ("sim", "snp", "tdx")
GPU_TEES = ("nvgpu",)
SEV_GUEST = Path("/dev/sev-guest")
CCEL_TABLE = Path("/sys/firmware/acpi/tables/CCEL")
CCEL_DATA = Path("/sys/firmware/acpi/tables/data/CCEL")
_CERT_ORDER = ("vcek", "vlek", "ask", "ark")


@dataclass(frozen=True)
class CpuEvidence:
    report: bytes
    certificates: tuple[bytes, ...] = ()
    event_log: bytes = b""  # TDX: the CC event log, replayed by the verifier to the quote's RTMRs


class CpuAttester(Protocol):
    tee: str

    def attest(self, report_data: bytes) -> CpuEvidence: ...


@dataclass(frozen=True)
class KernelInterfaces:
    """Where this guest's attestation interfaces are (defaults: the Linux paths)."""

    tsm_dir: Path = DEFAULT_BASE
    tsm_entry: str | None = None  # an entry made beforehand; None: a fresh one per report
    sev_guest: Path = SEV_GUEST
    ccel_table: Path = CCEL_TABLE  # ACPI CCEL table: where the TDX CC event log is, and how long
    ccel_data: Path = CCEL_DATA


def parse_tee(value: str) -> tuple[str, str | None]:
    """"snp+nvgpu" -> ("snp", "nvgpu"); refuses anything the verifier could not dispatch."""
    cpu, _, gpu = value.partition("+")
    if cpu not in (*CPU_TEES, "auto") or (gpu and gpu not in (*GPU_TEES, "auto")):
        raise UnsupportedError(f"unknown TEE {value!r}: use sim, snp, tdx or auto, optionally +nvgpu")
    if cpu == "sim" and gpu:
        raise UnsupportedError("the simulated TEE cannot vouch for GPU evidence; use snp+nvgpu or tdx+nvgpu")
    return cpu, gpu or None


def resolve_tee(value: str, *, probe: Callable[[], list[Any]] = detect) -> tuple[str, str | None]:
    """Settle `auto` parts from what this machine offers; never falls back to the simulated TEE."""
    cpu, gpu = parse_tee(value)
    if cpu != "auto" and gpu != "auto":
        return cpu, gpu
    caps = {c.tee: c for c in probe()}
    if cpu == "auto":
        found = [t for t in ("snp", "tdx") if caps.get(t) and caps[t].available]
        if not found:
            reasons = "; ".join(caps[t].reason for t in ("snp", "tdx") if t in caps)
            raise UnsupportedError(f"no hardware TEE detected ({reasons}); set tee=sim explicitly to simulate")
        cpu = found[0]
    if gpu == "auto":
        gpu = "nvgpu" if caps.get("nvgpu") and caps["nvgpu"].available else None
    return cpu, gpu


class SimAttester:
    """The simulated TEE (attestation.sim): reports signed by the local platform key."""

    tee = "sim"

    def __init__(self, tee: SimTee) -> None:
        self._tee = tee

    def attest(self, report_data: bytes) -> CpuEvidence:
        return CpuEvidence(self._tee.get_report(report_data))


def _check_report_data(report_data: bytes) -> None:
    if len(report_data) != 64:
        raise ValueError("REPORT_DATA must be exactly 64 bytes")


class SnpAttester:
    tee = "snp"

    def __init__(self, kernel: KernelInterfaces) -> None:
        self.kernel = kernel

    def attest(self, report_data: bytes) -> CpuEvidence:
        _check_report_data(report_data)
        k = self.kernel
        if k.tsm_dir.is_dir():
            try:
                report = TsmReportClient(k.tsm_dir, entry=k.tsm_entry).get_report(report_data)
                if report.provider != "sev_guest":
                    raise UnsupportedError(f"configfs-tsm provider is {report.provider!r}, not sev_guest")
                return self._evidence(report.outblob, parse_cert_table(report.auxblob or b""), report_data)
            except UnsupportedError as exc:
                if not k.sev_guest.exists():
                    raise
                log.info("configfs-tsm unusable (%s); falling back to %s", exc, k.sev_guest)
        elif not k.sev_guest.exists():
            raise UnsupportedError(f"not an SEV-SNP guest: neither {k.tsm_dir} nor {k.sev_guest} exists")
        # fcntl.ioctl is looked up now, not at import: the ioctl is the seam a fake device replaces.
        ev = collect_ioctl(report_data, device=k.sev_guest, ioctl=fcntl.ioctl)
        return self._evidence(ev.report, ev.certs, report_data)

    @staticmethod
    def _evidence(report: bytes, certs: dict[str, bytes], report_data: bytes) -> CpuEvidence:
        if parse_report(report).report_data != report_data:
            raise FreshnessError("the SNP report does not carry the REPORT_DATA that was requested")
        if not any(name in certs for name in ("vcek", "vlek")):
            # The broker can still fetch the VCEK from its collateral source (KDS or a bundle).
            log.info("the host supplied no VCEK/VLEK in the certificate table")
        return CpuEvidence(report, tuple(certs[n] for n in _CERT_ORDER if n in certs))


class TdxAttester:
    tee = "tdx"

    def __init__(self, kernel: KernelInterfaces) -> None:
        self.kernel = kernel

    def attest(self, report_data: bytes) -> CpuEvidence:
        _check_report_data(report_data)
        if not self.kernel.tsm_dir.is_dir():
            raise UnsupportedError(f"not a TDX guest with configfs-tsm: {self.kernel.tsm_dir} is missing")
        # The PCK chain travels inside the quote (certification data type 5).
        quote = collect_quote(report_data, TsmReportClient(self.kernel.tsm_dir, entry=self.kernel.tsm_entry))
        return CpuEvidence(quote, event_log=self._event_log())

    def _event_log(self) -> bytes:
        """The CCEL log area, as long as the ACPI table says; empty where the firmware has none."""
        k = self.kernel
        if not (k.ccel_table.is_file() and k.ccel_data.is_file()):
            log.info("no CC event log (ACPI CCEL) on this TD: RTMRs will not be replayed")
            return b""
        data = k.ccel_data.read_bytes()[: ccel_log_length(k.ccel_table.read_bytes())]
        parse_cc_event_log(data)  # a malformed log fails here, not as a refusal at the broker
        return data


class NvgpuAttester:
    """Every GPU of this VM through NVML (pynvml, imported when used)."""

    tee = "nvgpu"

    def __init__(self, nvml: Any = None) -> None:
        self._nvml = nvml

    def collect(self, nonce: bytes) -> tuple[GpuEvidence, ...]:
        try:
            gpus = nvcollect.collect_gpu_evidence(nonce, self._nvml)
        except UnsupportedError as exc:
            raise UnsupportedError(f"no GPU attestation report: {exc}") from exc
        return tuple(GpuEvidence(arch="hopper", evidence=g.evidence, certificate_chain=g.cert_chain) for g in gpus)

    def mark_ready(self) -> None:
        nvcollect.set_gpus_ready(self._nvml)


@dataclass(frozen=True)
class Attester:
    """A CPU attester and, optionally, the GPUs' attester: one evidence bundle per challenge."""

    cpu: CpuAttester
    gpu: NvgpuAttester | None = None
    workload: bytes = b""  # attestation.workload.WorkloadClaims.encode(): bound into every bundle
    # The init-data digest this guest was launched with (SNP HOST_DATA, TDX MRCONFIGID): a report
    # carrying another is never handed out (enclave_worker/workload_check.py). b"": not checked (sim).
    init_data_digest: bytes = b""

    def bundle(self, runtime: RuntimeData) -> EvidenceBundle:
        if self.workload:
            runtime = dataclasses.replace(runtime, workload=self.workload)
        # GPU first, for the broker's own nonce; the CPU report then binds that exact GPU evidence.
        gpus = self.gpu.collect(runtime.nonce) if self.gpu else ()
        evidence = self.cpu.attest(expected_report_data(runtime, gpus))
        if self.init_data_digest:
            check_report_carries(self.init_data_digest, self.cpu.tee, evidence.report)
        return EvidenceBundle(tee=self.cpu.tee, cpu_evidence=evidence.report, runtime_data=runtime,
                              cpu_certificates=evidence.certificates, gpus=gpus, event_log=evidence.event_log)

    def accepted(self) -> None:
        """The broker accepted the evidence: only now may the GPUs take work (nvtrust's order)."""
        if self.gpu is not None:
            self.gpu.mark_ready()


def hardware_attester(tee: str, gpu: str | None, kernel: KernelInterfaces) -> Attester:
    cpus: dict[str, Callable[[KernelInterfaces], CpuAttester]] = {"snp": SnpAttester, "tdx": TdxAttester}
    if tee not in cpus:
        raise UnsupportedError(f"no hardware attester for TEE {tee!r}")
    if gpu not in (None, "nvgpu"):
        raise UnsupportedError(f"no attester for GPU TEE {gpu!r}")
    return Attester(cpus[tee](kernel), NvgpuAttester() if gpu else None)
