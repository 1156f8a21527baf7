"""This worker's attester: the simulated TEE, or the hardware attesters in attestation.attesters."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from attestation.attesters import Attester, KernelInterfaces, SimAttester, hardware_attester
from attestation.bundle import EvidenceBundle, RuntimeData
from attestation.errors import UnsupportedError, WorkloadMismatch
from attestation.sim import SimTee
from attestation.workload import WorkloadClaims
from enclave_worker.measurement import simulated_measurement
from enclave_worker.settings import WorkerSettings
from enclave_worker.workload_check import check_runs_as_declared, load_init_data
from protocol.package.signing import read_manifest

log = logging.getLogger(__name__)


def _sim_attester(settings: WorkerSettings) -> Attester:
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
    log.warning("running on the SIMULATED TEE: no hardware protection; every answer is marked insecure")
    return Attester(SimAttester(SimTee(key, measurement)))


def workload_claims(settings: WorkerSettings, policy_version: int = 0) -> WorkloadClaims:
    """What every bundle of this worker binds (REPORT_DATA): its tenant, model, version, the digest
    of the package it will decrypt (boot refuses a package with another), the version of the signed
    tenant policy set it loaded (`policy_version`, 0 for none: a sealed request binds it) and its
    promises, so a client reads them from the hardware's signature rather than from the gateway."""
    manifest, _, _ = read_manifest(settings.package_dir)
    return WorkloadClaims(tenant=settings.tenant, model=settings.model, version=settings.version,
                          model_digest=manifest.plaintext_digest, promises=settings.promises(),
                          policy_version=policy_version)


def make_attester(settings: WorkerSettings, policy_version: int = 0) -> Attester:
    if settings.tee == "sim":
        if settings.gpu_tee:
            raise UnsupportedError("the simulated TEE cannot vouch for GPU evidence")
        attester = _sim_attester(settings)
    else:
        kernel = KernelInterfaces(settings.tsm_dir, settings.tsm_entry, settings.sev_guest_device,
                                  settings.ccel_table, settings.ccel_data)
        attester = hardware_attester(settings.tee, settings.gpu_tee, kernel)
    digest = b""
    if settings.init_data is not None and settings.tee != "sim":
        digest = load_init_data(settings.init_data).digest_for(settings.tee)
    return dataclasses.replace(attester, workload=workload_claims(settings, policy_version).encode(),
                               init_data_digest=digest)


def check_workload(settings: WorkerSettings, argv: Sequence[str], environ: Mapping[str, str]) -> None:
    """On SNP and TDX the init-data is required: the worker runs what it says, and its hardware
    carries its digest (every report is checked: Attester.bundle). The simulated TEE checks a given one."""
    if settings.init_data is None:
        if settings.tee != "sim":
            raise WorkloadMismatch("no --init-data: on SNP and TDX the evidence must name the workload")
        return
    launched = load_init_data(settings.init_data)
    check_runs_as_declared(launched.workload, argv, environ, settings)
    log.info("init-data %s%s: arguments, environment and configuration are as declared",
             launched.digest_for(settings.tee).hex() if settings.tee != "sim" else "(simulated TEE)",
             " (CoCo init-data)" if launched.coco is not None else "")


def bundle_maker(settings: WorkerSettings, policy_version: int = 0) -> Callable[[RuntimeData], EvidenceBundle]:
    return make_attester(settings, policy_version).bundle
