"""At start, before any key is made or opened: the key broker runs what its init-data says.

The broker's init-data (attestation/broker_initdata.py) is the document whose digest its hardware
carries (SNP HOST_DATA, TDX MRCONFIGID), and which workers and clients pin (`--broker-workload-id`,
a BrokerPin's `workload_ids`). This module makes the broker hold to it, as the worker does
(enclave_worker/workload_check.py):

1. its arguments, minus the interface locations below, are the document's `argv`, element by element
   (so every `--unsafe-*` switch, the key store, the Vault URL, the roots and collateral directories);
2. its measured environment is the document's `env`, exactly (the operator's credentials excepted:
   their values are secrets, and they grant only what the operator holds anyway: the admin API, which
   cannot change what releases a tenant's key, and access to OpenBao, whose keys never leave it);
3. its measured configuration (key_broker/measurement.py) is the document's;
4. its hardware reports the digest of this document (checked on every report: Attester.bundle,
   wired in key_broker/platform.py).

On SNP and TDX the init-data is required. The simulated TEE has no init-data field, hence no
workload id (a given document is still checked).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from attestation.broker_initdata import BrokerInitData
from attestation.coco_initdata import BrokerLaunchInitData, load_broker_launch_init_data
from attestation.errors import WorkloadMismatch
from attestation.launch_env import BROKER_UNMEASURED_ENV, BROKER_UNMEASURED_OPTIONS, launch_differences
from attestation.launch_env import measured_argv as _measured_argv
from attestation.launch_env import measured_env as _measured_env
from key_broker.measurement import measured_config
from key_broker.settings import BrokerSettings

# Where the guest kernel's attestation interfaces are, where the init-data file is, and the operator's
# credentials (secrets, from the pod's Secret): not measured (attestation/launch_env.py).
UNMEASURED_OPTIONS = BROKER_UNMEASURED_OPTIONS
UNMEASURED_ENV = BROKER_UNMEASURED_ENV


# `--init` (a fresh broker: new keys, a new instance identity that pinned parties refuse) changes no
# code or configuration: the same init-data starts the first run and every later one.
UNMEASURED_FLAGS = frozenset({"--init"})


def measured_argv(argv: Sequence[str]) -> tuple[str, ...]:
    return _measured_argv([a for a in argv if a not in UNMEASURED_FLAGS], UNMEASURED_OPTIONS)


def measured_env(environ: Mapping[str, str]) -> dict[str, str]:
    return _measured_env(environ, UNMEASURED_ENV)


def broker_init_data_for(image: str, argv: Sequence[str], environ: Mapping[str, str], settings: BrokerSettings,
                         agent_policy_digest: str = "") -> BrokerInitData:
    """The init-data a broker started with these arguments, environment and settings checks against."""
    return BrokerInitData(image=image, argv=measured_argv(argv), env=measured_env(environ),
                          measured_config=measured_config(settings), agent_policy_digest=agent_policy_digest)


def check_runs_as_declared(init: BrokerInitData, argv: Sequence[str], environ: Mapping[str, str],
                           settings: BrokerSettings) -> None:
    """Raise WorkloadMismatch naming every difference (names only: values may be secrets)."""
    flagless = [a for a in argv if a not in UNMEASURED_FLAGS]  # `--init` is not part of what was declared
    problems = launch_differences(init, flagless, environ, measured_config(settings), UNMEASURED_OPTIONS,
                                  UNMEASURED_ENV)
    if problems:
        raise WorkloadMismatch("; ".join(problems))


def check_broker_workload(settings: BrokerSettings, argv: Sequence[str],
                          environ: Mapping[str, str]) -> BrokerLaunchInitData | None:
    """On SNP and TDX the init-data is required and must describe this broker; None on the
    simulated TEE without one."""
    if settings.init_data is None:
        if settings.tee != "sim":
            raise WorkloadMismatch("no --init-data: on SNP and TDX the broker's evidence must name its workload")
        return None
    launched = load_broker_launch_init_data(settings.init_data.read_bytes())
    check_runs_as_declared(launched.broker, argv, environ, settings)
    return launched
