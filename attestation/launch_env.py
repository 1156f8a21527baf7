"""What of a confidential workload's command line and environment its init-data names (shared by
the worker, enclave_worker/workload_check.py, and the key broker, key_broker/workload_check.py).

Arguments are measured element by element, except the options a role names as interface locations
(where the guest kernel's attestation interfaces are, where the init-data file is): evidence is
signed by the TEE whichever path it came through. Environment variables are measured when their
name can change what the interpreter, its libraries or the role do (the prefixes below).
"""

from __future__ import annotations

import json
import os
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

# Environment variables that can change what the interpreter, its libraries or the role do. Beside
# the interpreter's and the role's own: the C library's tunables (malloc's, and the parser behind
# CVE-2023-4911), the dynamic loader, each threading runtime the engine loads (GNU and Intel OpenMP,
# OpenBLAS, oneDNN, torch under both its prefixes), TLS, gRPC and proxies.
MEASURED_ENV_PREFIXES = ("SEALED_", "PYTHON", "LD_", "GLIBC_TUNABLES", "MALLOC_", "OMP_", "GOMP_", "KMP_", "MKL_",
                         "OPENBLAS_", "GOTO_", "ONEDNN_", "DNNL_", "TORCH", "PYTORCH_", "CUDA", "NCCL_", "NVIDIA_",
                         "VLLM_", "HF_", "TRANSFORMERS_", "TOKENIZERS_", "SSL_", "REQUESTS_",
                         "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy",
                         "GRPC_", "OPENSSL_")
# Where the guest kernel's attestation interfaces are and where the init-data file is: not measured
# (evidence is signed by the TEE whichever path it came through). The worker's also excludes the
# address the gateway is told (the pod IP differs per pod).
BROKER_UNMEASURED_OPTIONS = frozenset({"--tsm-dir", "--tsm-entry", "--sev-guest-device", "--ccel-table",
                                       "--ccel-data", "--init-data"})
WORKER_UNMEASURED_OPTIONS = BROKER_UNMEASURED_OPTIONS | {"--advertise-host"}
# The broker operator's credentials (key_broker/settings.py): secrets, from the pod's Secret.
BROKER_UNMEASURED_ENV = frozenset({"SEALED_BROKER_ADMIN_TOKEN", "SEALED_VAULT_TOKEN"})


class LaunchDocument(Protocol):
    """What a role's init-data names of its launch (attestation/initdata.py, broker_initdata.py)."""

    @property
    def argv(self) -> tuple[str, ...]: ...
    @property
    def env(self) -> Mapping[str, str]: ...
    @property
    def measured_config(self) -> Mapping[str, Any]: ...


def measured_argv(argv: Sequence[str], unmeasured: Collection[str]) -> tuple[str, ...]:
    """`argv` without the `unmeasured` options and their values (`--opt value` or `--opt=value`)."""
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
            continue
        name = arg.split("=", 1)[0]
        if name in unmeasured:
            skip = "=" not in arg
            continue
        out.append(arg)
    return tuple(out)


def measured_env(environ: Mapping[str, str], unmeasured: Collection[str] = ()) -> dict[str, str]:
    """The measured variables of `environ`, less the names a role declares unmeasured (secrets)."""
    return {k: v for k, v in sorted(environ.items()) if k.startswith(MEASURED_ENV_PREFIXES) and k not in unmeasured}


def process_environ() -> dict[str, str]:
    """The environment this process was started with (/proc/self/environ): what the runtime set,
    not what an imported library added since (threadpoolctl and torch set KMP_DUPLICATE_LIB_OK)."""
    try:
        raw = Path("/proc/self/environ").read_bytes()
    except OSError:
        return dict(os.environ)
    pairs = (item.decode(errors="surrogateescape").partition("=") for item in raw.split(b"\0") if item)
    return {k: v for k, _, v in pairs}


def first_difference(mine: Sequence[str], declared: Sequence[str]) -> str:
    """Where two argument lists first differ: the position and the option before it, never a value
    (it may be a secret)."""
    at = next((i for i, (a, b) in enumerate(zip(mine, declared, strict=False)) if a != b),
              min(len(mine), len(declared)))
    near = next((a.split("=")[0] for a in reversed(mine[:at + 1]) if a.startswith("--")), "")
    return f"first at argument {at}, option {near or '-'}"


def launch_differences(declared: LaunchDocument, argv: Sequence[str], environ: Mapping[str, str],
                       measured_config: Mapping[str, Any], unmeasured_options: Collection[str],
                       unmeasured_env: Collection[str] = ()) -> list[str]:
    """How a process started with `argv` and `environ`, configured as `measured_config`, differs from
    the launch its init-data declares: one line per kind of difference, naming options and variables,
    never values (they may be secrets). Shared by the worker and the key broker (workload_check.py)."""
    problems: list[str] = []
    mine = measured_argv(argv, unmeasured_options)
    if mine != declared.argv:
        problems.append(f"arguments differ from the init-data's ({first_difference(mine, declared.argv)})")
    env = measured_env(environ, unmeasured_env)
    changed = sorted(k for k in set(env) | set(declared.env) if env.get(k) != declared.env.get(k))
    if changed:
        problems.append(f"environment differs from the init-data's: {', '.join(changed)}")
    canonical = json.loads(json.dumps(dict(measured_config)))
    if canonical != declared.measured_config:
        keys = sorted(k for k in set(canonical) | set(declared.measured_config)
                      if canonical.get(k) != declared.measured_config.get(k))
        problems.append(f"measured configuration differs from the init-data's: {', '.join(keys)}")
    return problems
