"""attestation: verify that a Sealed deployment runs the code you expect, in a real TEE, before you
send it anything.

A client needs five names::

    from attestation import AppraisalPolicy, AttestationError, VerifierTrust, verify_deployment

    policy = AppraisalPolicy(allowed_tee=frozenset({"snp", "tdx"}),
                             allowed_measurements=frozenset({"9f86d0...", }),
                             require_gpu_cc=True)
    trust = VerifierTrust()  # the vendors' pinned roots (AMD, Intel, NVIDIA) shipped in attestation/roots
    try:
        workers = verify_deployment("https://gateway.example", broker_jwks, policy,
                                    evidence_trust=trust, api_key=key)
    except AttestationError as exc:  # no worker verifies: send nothing
        raise SystemExit(f"refusing to talk to this deployment: {exc}")
    worker = workers[0]  # PinnedWorker: its measurement, TEE and the HPKE key to seal requests to

- `verify_deployment` fetches `/.well-known/attestation` and, for each worker, verifies the
  hardware evidence itself (signatures and chains to the pinned vendor roots, TCB and collateral,
  REPORT_DATA recomputed from the worker's HPKE key and workload claims), appraises the verified
  claims under your policy, and only then checks the key broker's token as corroboration (it must
  describe exactly that evidence); it returns the workers that pass (`PinnedWorker`) or raises.
- `AppraisalPolicy`: what you accept (TEE types, measurements, workload ids, TCB status, debug,
  VMPL, GPU CC mode); every empty allow-set allows nothing.
- `VerifierTrust`: the trust anchors (pinned roots, offline collateral sources); the simulated
  TEE's platform key only where a test or demo accepts the simulated TEE.
- `AttestationError`: the base of every refusal (bad signature or chain, stale or mismatched
  evidence, a policy violation); one `except` covers them all.
- `verify_bundle` is the verifier itself, for a relying party that holds raw evidence (the key
  broker does).

The names load on first use, so `import attestation.bundle` (the worker's collectors) does not
load every verifier. The rest is in the submodules: `bundle` (evidence format), `token` (EAT
claims), `snp`, `tdx`, `nvgpu` (per-TEE verifiers and collectors), `sim` (the simulated TEE).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from attestation.appraisal import AppraisalPolicy
    from attestation.client import PinnedWorker, verify_deployment
    from attestation.errors import AttestationError
    from attestation.verifier import VerifierTrust, verify_bundle

__all__ = ["AppraisalPolicy", "AttestationError", "PinnedWorker", "VerifierTrust", "verify_bundle",
           "verify_deployment"]


def __getattr__(name: str) -> Any:
    # Plain import statements (not importlib): the worker's measured import closure and the import
    # contracts see them as they see any other import.
    if name == "verify_deployment" or name == "PinnedWorker":
        from attestation import client

        return getattr(client, name)
    if name == "AppraisalPolicy":
        from attestation.appraisal import AppraisalPolicy

        return AppraisalPolicy
    if name == "AttestationError":
        from attestation.errors import AttestationError

        return AttestationError
    if name == "verify_bundle" or name == "VerifierTrust":
        from attestation import verifier

        return getattr(verifier, name)
    raise AttributeError(f"module 'attestation' has no attribute {name!r}")
