"""Attester side: collect Hopper GPU evidence through NVML (nvidia-ml-py), then mark GPUs ready.

The NVML module is injected (pynvml by default) so tests drive a fake with the same surface:
nvmlInit/nvmlShutdown, nvmlSystemGetConfComputeState, nvmlDeviceGetCount,
nvmlDeviceGetHandleByIndex, nvmlDeviceGetUUID, nvmlDeviceGetConfComputeGpuAttestationReport,
nvmlDeviceGetConfComputeGpuCertificate, nvmlSystemSetConfComputeGpusReadyState, NVMLError.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

from attestation.errors import ParseError, PolicyViolation, UnsupportedError
from attestation.nvgpu.abi import NONCE_LEN, parse_evidence

T = TypeVar("T")
# NVML constants (nvml.h), repeated so a fake NVML needs only the functions.
CC_FEATURE_ENABLED = 1
CC_DEVTOOLS_OFF = 0
CC_ENVIRONMENT_PROD = 2
CC_ACCEPTING_CLIENT_REQUESTS_TRUE = 1


@dataclass(frozen=True)
class CollectedGpu:
    index: int
    uuid: str
    evidence: bytes  # SPDM request || response, as NVML returned it
    cert_chain: bytes  # PEM, leaf first (NVML attestationCertChain)

    def to_json(self) -> dict[str, str]:
        """The entry format of NVIDIA's multi-GPU evidence lists (ppcie gpu_evidence.json)."""
        ev = parse_evidence(self.evidence)
        return {
            "arch": "HOPPER", "version": "1.0", "nonce": ev.nonce.hex(), "uuid": self.uuid,
            "driver_version": ev.driver_version, "vbios_version": ev.vbios_version,
            "evidence": base64.b64encode(self.evidence).decode(),
            "certificate": base64.b64encode(self.cert_chain).decode(),
        }


def bundle_json(gpus: list[CollectedGpu]) -> bytes:
    return json.dumps([g.to_json() for g in gpus]).encode()


def _default_nvml() -> Any:
    try:
        import pynvml
    except ImportError as exc:  # nvidia-ml-py is the optional `gpu` extra
        raise UnsupportedError("nvidia-ml-py (pynvml) is not installed") from exc
    return pynvml


@contextmanager
def _session(nvml: Any) -> Iterator[None]:
    error = getattr(nvml, "NVMLError", Exception)
    try:
        nvml.nvmlInit()
    except error as exc:
        raise UnsupportedError(f"NVML unavailable: {exc}") from exc
    try:
        yield
    finally:
        nvml.nvmlShutdown()


def _call(nvml: Any, fn: Callable[..., T], *args: Any) -> T:
    try:
        return fn(*args)
    except getattr(nvml, "NVMLError", Exception) as exc:
        raise UnsupportedError(f"NVML {getattr(fn, '__name__', 'call')} failed: {exc}") from exc


def check_cc_state(nvml: Any) -> None:
    """Refuse unless CC is on in production mode with devtools off (devtools weakens isolation)."""
    state = _call(nvml, nvml.nvmlSystemGetConfComputeState)
    if state.ccFeature != CC_FEATURE_ENABLED:
        raise UnsupportedError("GPU confidential computing is off: no attestation report can be produced")
    problems = []
    if state.devToolsMode != CC_DEVTOOLS_OFF:
        problems.append("GPU confidential computing is in devtools mode")
    if state.environment != CC_ENVIRONMENT_PROD:
        problems.append(f"GPU CC environment is {state.environment}, not production")
    if problems:
        raise PolicyViolation(problems)


def collect_gpu_evidence(nonce: bytes, nvml: Any | None = None) -> list[CollectedGpu]:
    """Evidence from every GPU for our 32-byte `nonce` (the relying party's challenge)."""
    if len(nonce) != NONCE_LEN:
        raise ValueError(f"nonce must be {NONCE_LEN} bytes")
    nv = nvml if nvml is not None else _default_nvml()
    out: list[CollectedGpu] = []
    with _session(nv):
        check_cc_state(nv)
        count = _call(nv, nv.nvmlDeviceGetCount)
        if count < 1:
            raise UnsupportedError("no NVIDIA GPU present")
        for index in range(count):
            handle = _call(nv, nv.nvmlDeviceGetHandleByIndex, index)
            uuid = _call(nv, nv.nvmlDeviceGetUUID, handle)
            report = _call(nv, nv.nvmlDeviceGetConfComputeGpuAttestationReport, handle, nonce)
            size = int(report.attestationReportSize)
            evidence = bytes(report.attestationReport[:size])
            cert = _call(nv, nv.nvmlDeviceGetConfComputeGpuCertificate, handle)
            chain = bytes(cert.attestationCertChain[: int(cert.attestationCertChainSize)])
            # Fail early on a driver that did not use our nonce; the verifier checks it again.
            if parse_evidence(evidence).nonce != nonce:
                raise ParseError(f"GPU {index}: NVML returned a report for a different nonce")
            out.append(CollectedGpu(index, uuid if isinstance(uuid, str) else uuid.decode(), evidence, chain))
    return out


def set_gpus_ready(nvml: Any | None = None) -> None:
    """Tell the driver the GPUs may accept work; call only after verification succeeded."""
    nv = nvml if nvml is not None else _default_nvml()
    with _session(nv):
        _call(nv, nv.nvmlSystemSetConfComputeGpusReadyState, CC_ACCEPTING_CLIENT_REQUESTS_TRUE)


def attest_and_ready(
    nonce: bytes, verify: Callable[[list[CollectedGpu]], T], nvml: Any | None = None
) -> T:
    """Collect, run the caller's verify+validate, and set the ready state only if it returned."""
    gpus = collect_gpu_evidence(nonce, nvml)
    result = verify(gpus)  # raises on any failure, so the GPUs stay not-ready
    set_gpus_ready(nvml)
    return result
