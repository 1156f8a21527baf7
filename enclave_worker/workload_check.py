"""At start, before anything is attested or fetched: the worker runs what its init-data says.

The init-data (attestation/initdata.py) is the document whose digest the hardware carries (SNP
HOST_DATA, TDX MRCONFIGID). A relying party that allows that digest allows what the document
names; this module makes the worker hold to it:

1. its hardware reports the digest of the init-data file it was given (else the file is not the
   one the host launched it with, and the evidence describes another workload): every report is
   checked before it leaves the worker (attestation/attesters.py, Attester.bundle);
2. its arguments, minus the interface locations below, are the document's `argv`, element by element;
3. its measured environment (names with the prefixes below) is the document's `env`, exactly;
4. its measured configuration (`WorkerSettings.measured_config()`, which hashes the tenant's
   policy-admin key file) is the document's, and its tenant-policy floor is the document's.

A difference in 2-4 raises WorkloadMismatch at start, and the worker exits with EXIT_CONFIG_ERROR; a
report without the digest (1) fails the boot before any evidence reaches the key broker.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from attestation import launch_env
from attestation.coco_initdata import LaunchInitData, load_launch_init_data
from attestation.errors import WorkloadMismatch
from attestation.initdata import InitData
from attestation.launch_env import (
    MEASURED_ENV_PREFIXES,
    WORKER_UNMEASURED_OPTIONS,
    launch_differences,
    process_environ,
)
from enclave_worker.settings import WorkerSettings

# Where the guest kernel's interfaces are and which address the gateway is told (attestation/launch_env.py).
UNMEASURED_OPTIONS = WORKER_UNMEASURED_OPTIONS
__all__ = ["MEASURED_ENV_PREFIXES", "UNMEASURED_OPTIONS", "check_runs_as_declared", "init_data_for", "load_init_data",
           "measured_argv", "measured_env", "process_environ"]


def measured_argv(argv: Sequence[str]) -> tuple[str, ...]:
    """`argv` without the unmeasured options and their values (`--opt value` or `--opt=value`)."""
    return launch_env.measured_argv(argv, UNMEASURED_OPTIONS)


def measured_env(environ: Mapping[str, str]) -> dict[str, str]:
    return launch_env.measured_env(environ)


def init_data_for(image: str, argv: Sequence[str], environ: Mapping[str, str], settings: WorkerSettings,
                  agent_policy_digest: str = "") -> InitData:
    """The init-data a worker started with these arguments, environment and settings checks against."""
    return InitData(image=image, argv=measured_argv(argv), env=measured_env(environ),
                    measured_config=settings.measured_config(), min_policy_version=settings.min_policy_version,
                    agent_policy_digest=agent_policy_digest)


def load_init_data(path: Path) -> LaunchInitData:
    """The Sealed document the guest was launched with, bare or inside CoCo's init-data TOML (a Kata
    pod: attestation/coco_initdata.py), and so which digest the hardware must report for it."""
    return load_launch_init_data(path.read_bytes())


def check_runs_as_declared(init: InitData, argv: Sequence[str], environ: Mapping[str, str],
                           settings: WorkerSettings) -> None:
    """Raise WorkloadMismatch naming every difference (names only: values may be secrets)."""
    problems = launch_differences(init, argv, environ, settings.measured_config(), UNMEASURED_OPTIONS)
    if settings.min_policy_version != init.min_policy_version:
        problems.append("the tenant policy floor differs from the init-data's")
    if problems:
        raise WorkloadMismatch("; ".join(problems))
