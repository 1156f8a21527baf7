"""May this worker serve on its GPU? Confidential computing on, attested with the CPU, or the
tenant's explicit and logged `unsafe_allow_gpu_cc_off` (answers then marked insecure).

A GPU in CC mode keeps weights, KV cache and activations in its protected memory and encrypts
its PCIe traffic with the CVM (bounce buffers); with CC off both are plain to the host. A GPU in
CC mode refuses work until its ready state is set, which the worker does only after the broker
accepted its evidence (attestation.attesters), so a CC GPU must be attested (tee=...+nvgpu).
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

from attestation.errors import UnsupportedError
from attestation.nvgpu.collect import CC_FEATURE_ENABLED
from enclave_worker.settings import WorkerSettings
from policy.policyset import PolicySet

log = logging.getLogger(__name__)


def gpu_cc_on(nvml: Any = None) -> bool:
    """True when NVML reports CC mode on; False when it is off or NVML cannot say (no driver)."""
    if nvml is None:
        try:
            import pynvml

            nvml = pynvml
        except ImportError:
            return False
    try:
        nvml.nvmlInit()
    except Exception:  # any NVML failure: no CC GPU we could rely on
        return False
    try:
        return int(nvml.nvmlSystemGetConfComputeState().ccFeature) == CC_FEATURE_ENABLED
    except Exception:
        return False
    finally:
        with contextlib.suppress(Exception):
            nvml.nvmlShutdown()


def check_gpu_confidentiality(settings: WorkerSettings, policy_set: PolicySet | None, nvml: Any = None) -> bool:
    """Raise unless serving on this device is allowed; returns True when the GPU's CC is off
    (allowed by the tenant's policy, so every answer must be marked insecure)."""
    if not settings.on_gpu or settings.gpu_tee == "nvgpu":
        return False  # CPU only, or GPUs attested in CC mode (collection refuses CC off)
    if gpu_cc_on(nvml):
        raise UnsupportedError("the GPU is in confidential-computing mode but not attested: run with "
                               "tee=snp+nvgpu or tdx+nvgpu so it is verified and set ready")
    release = policy_set.release_for(settings.model, settings.version) if policy_set else None
    if release is None or not release.unsafe_allow_gpu_cc_off:
        raise UnsupportedError("GPU confidential computing is off: refusing to serve on it (the tenant's "
                               "policy may allow it with unsafe_allow_gpu_cc_off; answers are then insecure)")
    log.warning("UNSAFE: serving on a GPU with confidential computing OFF (tenant policy %s sets "
                "unsafe_allow_gpu_cc_off): weights and prompts are visible to the host; answers marked insecure",
                release.policy_id)
    return True
