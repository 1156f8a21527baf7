"""Evidence collection for this worker: the simulated TEE here; SNP/TDX collectors where present."""

from __future__ import annotations

import logging
from collections.abc import Callable

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from attestation.bundle import EvidenceBundle, RuntimeData, expected_report_data
from attestation.errors import UnsupportedError
from attestation.sim import SimTee
from enclave_worker.measurement import simulated_measurement
from enclave_worker.settings import WorkerSettings

log = logging.getLogger(__name__)


def bundle_maker(settings: WorkerSettings) -> Callable[[RuntimeData], EvidenceBundle]:
    if settings.tee != "sim":
        raise UnsupportedError(f"TEE {settings.tee!r} collection is not available on this machine")
    if settings.sim_platform_key is None:
        raise UnsupportedError("the simulated TEE needs its platform key")
    key = serialization.load_pem_private_key(settings.sim_platform_key.read_bytes(), password=None)
    if not isinstance(key, Ed25519PrivateKey):
        raise UnsupportedError("sim platform key must be Ed25519")
    if settings.unsafe_sim_measurement:
        log.warning("UNSAFE: simulated measurement overridden by configuration")
        measurement = bytes.fromhex(settings.unsafe_sim_measurement)
    else:
        measurement = simulated_measurement(settings.measured_config())
    tee = SimTee(key, measurement)
    log.warning("running on the SIMULATED TEE: no hardware protection; every answer is marked insecure")

    def make(runtime: RuntimeData) -> EvidenceBundle:
        report = tee.get_report(expected_report_data(runtime, ()))
        return EvidenceBundle(tee="sim", cpu_evidence=report, runtime_data=runtime)

    return make
