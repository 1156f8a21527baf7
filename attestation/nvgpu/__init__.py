"""NVIDIA Hopper GPU attestation (SPDM 1.1 measurements, NVIDIA device PKI, RIMs)."""

from attestation.nvgpu.abi import GpuEvidence, parse_evidence
from attestation.nvgpu.validate import Policy, to_claims, validate
from attestation.nvgpu.verify import GpuVerifyOptions, VerifiedGpu, verify_gpu_evidence, verify_gpu_list

__all__ = [
    "GpuEvidence", "GpuVerifyOptions", "Policy", "VerifiedGpu", "parse_evidence", "to_claims", "validate",
    "verify_gpu_evidence", "verify_gpu_list",
]
