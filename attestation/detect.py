"""What this machine can attest with, and why the rest is unavailable (`sealed attest detect`)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TSM_REPORT = Path("/sys/kernel/config/tsm/report")
SEV_GUEST = Path("/dev/sev-guest")
TDX_GUEST = Path("/dev/tdx_guest")


@dataclass(frozen=True)
class Capability:
    tee: str  # snp | tdx | nvgpu | sim
    available: bool
    reason: str


def _cpu_flags(cpuinfo: Path) -> set[str]:
    try:
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def _nvml_state(load_nvml: Callable[[], Any]) -> Capability:
    try:
        nvml = load_nvml()
    except ImportError:
        return Capability("nvgpu", False, "nvidia-ml-py (pynvml) is not installed")
    try:
        nvml.nvmlInit()
    except Exception as exc:  # NVMLError subclasses vary by driver; any failure means "no usable GPU"
        return Capability("nvgpu", False, f"NVML unavailable: {type(exc).__name__} (no NVIDIA driver or GPU)")
    try:
        state = nvml.nvmlSystemGetConfComputeState()
        if not getattr(state, "ccFeature", 0):
            return Capability("nvgpu", False, "GPU present but confidential computing mode is off")
        if getattr(state, "devToolsMode", 0):
            return Capability("nvgpu", False, "GPU CC is in devtools mode, which attestation refuses")
        return Capability("nvgpu", True, "NVIDIA GPU in confidential-computing mode")
    except Exception as exc:
        return Capability("nvgpu", False, f"GPU does not report CC state: {type(exc).__name__}")
    finally:
        # A shutdown failure after a failed query changes nothing we report.
        with contextlib.suppress(Exception):
            nvml.nvmlShutdown()


def _default_nvml() -> Any:
    import pynvml

    return pynvml


def detect(*, tsm: Path = TSM_REPORT, sev_guest: Path = SEV_GUEST, tdx_guest: Path = TDX_GUEST,
           cpuinfo: Path = Path("/proc/cpuinfo"), load_nvml: Callable[[], Any] = _default_nvml) -> list[Capability]:
    flags = _cpu_flags(cpuinfo)
    tsm_ok = tsm.is_dir() and os.access(tsm, os.W_OK)
    caps = []
    if sev_guest.exists() or (tsm_ok and "sev_snp" in flags):
        via = "/dev/sev-guest" if sev_guest.exists() else "configfs-tsm"
        caps.append(Capability("snp", True, f"SEV-SNP guest ({via})"))
    else:
        caps.append(Capability("snp", False, "not an SEV-SNP guest: no /dev/sev-guest and no sev_snp CPU flag"))
    if tdx_guest.exists() or (tsm_ok and "tdx_guest" in flags):
        caps.append(Capability("tdx", True, "TDX guest (configfs-tsm)" if tsm_ok else "TDX guest (/dev/tdx_guest)"))
    else:
        caps.append(Capability("tdx", False, "not a TDX guest: no /dev/tdx_guest and no tdx_guest CPU flag"))
    if not tsm_ok and any(c.available for c in caps):
        caps = [Capability(c.tee, c.available, c.reason + "; configfs-tsm missing or not writable") for c in caps]
    caps.append(_nvml_state(load_nvml))
    caps.append(Capability("sim", True, "simulated TEE: always available, INSECURE (no hardware protection)"))
    return caps
