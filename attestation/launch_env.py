"""What of a confidential workload's command line and environment its init-data names (shared by
the worker, enclave_worker/workload_check.py, and the key broker, key_broker/workload_check.py).

Arguments are measured element by element, except the options a role names as interface locations
(where the guest kernel's attestation interfaces are, where the init-data file is): evidence is
signed by the TEE whichever path it came through. Environment variables are measured when their
name can change what the interpreter, its libraries or the role do (the prefixes below).
"""

from __future__ import annotations

import os
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path

# Environment variables that can change what the interpreter, its libraries or the role do. Beside
# the interpreter's and the role's own: the C library's tunables (malloc's, and the parser behind
# CVE-2023-4911), the dynamic loader, each threading runtime the engine loads (GNU and Intel OpenMP,
# OpenBLAS, oneDNN, torch under both its prefixes), TLS, gRPC and proxies.
MEASURED_ENV_PREFIXES = ("SEALED_", "PYTHON", "LD_", "GLIBC_TUNABLES", "MALLOC_", "OMP_", "GOMP_", "KMP_", "MKL_",
                         "OPENBLAS_", "GOTO_", "ONEDNN_", "DNNL_", "TORCH", "PYTORCH_", "CUDA", "NCCL_", "NVIDIA_",
                         "VLLM_", "HF_", "TRANSFORMERS_", "TOKENIZERS_", "SSL_", "REQUESTS_",
                         "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy",
                         "GRPC_", "OPENSSL_")


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
