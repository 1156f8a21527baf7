"""A fake NVML (the `pynvml` module of nvidia-ml-py) for attesters on machines without a CC GPU.

It has the surface the attester uses (nvmlInit ... nvmlSystemSetConfComputeGpusReadyState) and
answers in one of three ways:
* `FakeNvml.cc_on(gpus)`: GPUs in CC mode whose reports are SPDM evidence signed by a test
  device PKI for the nonce asked (`sealed_fakes.platform.GpuIdentity`);
* `FakeNvml.replay(report, chain)`: a GPU that returns the same real captured H100 report and
  certificate chain whatever nonce is asked (the nvtrust capture in the test vectors);
* `FakeNvml.from_capture(path)`: the recorded answers of a real H200 with CC off (CC state,
  and NVML error 999 from the report and certificate calls), as captured in testvectors/nvml.
`install()` makes `import pynvml` return it, so attester code runs unchanged.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_UNKNOWN = 999
_MESSAGES = {1: "Uninitialized", 2: "Invalid Argument", 3: "Not Supported", 999: "Unknown Error"}


class NVMLError(Exception):
    """Like pynvml.NVMLError: `value` is the NVML return code, str() is nvmlErrorString."""

    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return _MESSAGES.get(self.value, f"NVML error {self.value}")


@dataclass
class FakeGpu:
    uuid: str
    name: str = "NVIDIA H100 80GB HBM3"
    # nonce -> report bytes; None: the call fails with `error`
    report: Callable[[bytes], bytes] | None = None
    chain: bytes = b""
    error: int = NVML_ERROR_UNKNOWN


@dataclass
class FakeNvml:
    gpus: Sequence[FakeGpu]
    cc_feature: int = 1  # NVML_CC_SYSTEM_FEATURE_ENABLED
    devtools: int = 0
    environment: int = 2  # NVML_CC_SYSTEM_ENVIRONMENT_PROD
    gpus_caps: int = 1
    driver: str = "550.90.07"
    ready: int = 0
    initialised: bool = False
    calls: list[str] = field(default_factory=list)
    NVMLError: type[NVMLError] = NVMLError

    # ---- constructors ---------------------------------------------------------------------
    @classmethod
    def cc_on(cls, identities: Sequence[Any], make_report: Callable[[Any, int, bytes], bytes]) -> FakeNvml:
        """GPUs in CC mode; `make_report(identity, index, nonce)` signs each report."""
        def reporter(identity: Any, index: int) -> Callable[[bytes], bytes]:
            return lambda nonce: make_report(identity, index, nonce)

        gpus = [FakeGpu(uuid=ident.uuid, report=reporter(ident, i), chain=ident.chain_pem())
                for i, ident in enumerate(identities)]
        return cls(gpus)

    @classmethod
    def replay(cls, report: bytes, chain: bytes, uuid: str = "GPU-captured") -> FakeNvml:
        return cls([FakeGpu(uuid=uuid, report=lambda _nonce: report, chain=chain)])

    @classmethod
    def from_capture(cls, path: Path) -> FakeNvml:
        """A GPU as recorded by the probe in testvectors/nvml (e.g. an H200 with CC off)."""
        calls = json.loads(path.read_text())["calls"]

        def value(name: str) -> Any:
            return calls[name]["value"] if calls.get(name, {}).get("ok") else None

        state = value("cc_state") or {}
        gpu = FakeGpu(uuid=value("uuid") or "GPU-unknown", name=value("name") or "NVIDIA GPU")
        if calls.get("cc_report", {}).get("ok") is False:
            gpu.report, gpu.error = None, int(calls["cc_report"]["code"] or NVML_ERROR_UNKNOWN)
        caps = value("cc_capabilities") or {}
        return cls([gpu], cc_feature=int(state.get("ccFeature", 0)), devtools=int(state.get("devToolsMode", 0)),
                   environment=int(state.get("environment", 0)), gpus_caps=int(caps.get("gpusCaps", 0)),
                   driver=value("driver") or "unknown", ready=int(value("cc_gpus_ready") or 0))

    def install(self) -> None:
        sys.modules["pynvml"] = self  # type: ignore[assignment]

    # ---- the pynvml surface -----------------------------------------------------------------
    def _check(self, name: str) -> None:
        self.calls.append(name)
        if not self.initialised:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)

    def nvmlInit(self) -> None:
        self.calls.append("nvmlInit")
        self.initialised = True

    def nvmlShutdown(self) -> None:
        self._check("nvmlShutdown")
        self.initialised = False

    def nvmlSystemGetDriverVersion(self) -> str:
        self._check("nvmlSystemGetDriverVersion")
        return self.driver

    def nvmlSystemGetConfComputeState(self) -> SimpleNamespace:
        self._check("nvmlSystemGetConfComputeState")
        return SimpleNamespace(environment=self.environment, ccFeature=self.cc_feature, devToolsMode=self.devtools)

    def nvmlSystemGetConfComputeCapabilities(self) -> SimpleNamespace:
        self._check("nvmlSystemGetConfComputeCapabilities")
        return SimpleNamespace(cpuCaps=0, gpusCaps=self.gpus_caps)

    def nvmlSystemGetConfComputeGpusReadyState(self) -> int:
        self._check("nvmlSystemGetConfComputeGpusReadyState")
        return self.ready

    def nvmlSystemSetConfComputeGpusReadyState(self, state: int) -> int:
        self._check("nvmlSystemSetConfComputeGpusReadyState")
        self.ready = int(state)
        return 0

    def nvmlDeviceGetCount(self) -> int:
        self._check("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeGpu:
        self._check("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(self.gpus):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return self.gpus[index]

    def nvmlDeviceGetUUID(self, handle: FakeGpu) -> str:
        self._check("nvmlDeviceGetUUID")
        return handle.uuid

    def nvmlDeviceGetName(self, handle: FakeGpu) -> str:
        self._check("nvmlDeviceGetName")
        return handle.name

    def nvmlDeviceGetConfComputeGpuAttestationReport(self, handle: FakeGpu, nonce: bytes) -> SimpleNamespace:
        self._check("nvmlDeviceGetConfComputeGpuAttestationReport")
        if handle.report is None or not self.cc_feature:
            raise NVMLError(handle.error)
        report = handle.report(bytes(nonce))
        return SimpleNamespace(attestationReportSize=len(report), attestationReport=list(report),
                               nonce=list(nonce))

    def nvmlDeviceGetConfComputeGpuCertificate(self, handle: FakeGpu) -> SimpleNamespace:
        self._check("nvmlDeviceGetConfComputeGpuCertificate")
        if handle.report is None or not self.cc_feature:
            raise NVMLError(handle.error)
        return SimpleNamespace(attestationCertChainSize=len(handle.chain), attestationCertChain=list(handle.chain),
                               certChainSize=0, certChain=[])
